#ifndef CCRC32C_H
#define CCRC32C_H
#include <stddef.h>
#include <stdint.h>

// CRC-32C with the CPU's instruction (SSE4.2 on x86-64, the CRC extension on
// AArch64). LogFormat calls it when ccrc32c_available() says the CPU has it
// and otherwise uses its own table-driven code; the tests check they agree.

/// 1 when ccrc32c_update can run on this CPU, 0 otherwise.
int ccrc32c_available(void);

/// Continues a CRC-32C: takes and returns the checksum without the final
/// inversion (the caller inverts before and after, as for the table form).
uint32_t ccrc32c_update(uint32_t crc, const void *bytes, size_t count);

#endif
