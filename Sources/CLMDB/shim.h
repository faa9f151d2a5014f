#ifndef CLMDB_SHIM_H
#define CLMDB_SHIM_H
// The one header Swift sees of liblmdb. Only the LMDB module (and the raw
// baseline in Tools/bench) import it; everything else goes through LMDB.
#include <lmdb.h>

// Asks the CPU for the first cache lines of a value all at once, so that
// decoding a value that is not in the caches (a point read on a big table)
// waits about one memory latency rather than one per line. Past 512 bytes
// the hardware's own prefetcher has seen the stream.
static inline void clmdb_prefetch(const void *start, size_t count) {
    const char *bytes = (const char *)start;
    size_t end = count < 512 ? count : 512;
    for (size_t offset = 0; offset < end; offset += 64) __builtin_prefetch(bytes + offset);
}
#endif
