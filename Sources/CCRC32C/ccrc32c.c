#include "ccrc32c.h"
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>

int ccrc32c_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}

__attribute__((target("sse4.2")))
uint32_t ccrc32c_update(uint32_t crc, const void *bytes, size_t count) {
    const unsigned char *p = bytes;
    uint64_t crc64 = crc;
    while (count >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        crc64 = _mm_crc32_u64(crc64, word);
        p += 8;
        count -= 8;
    }
    uint32_t crc32 = (uint32_t)crc64;
    while (count > 0) {
        crc32 = _mm_crc32_u8(crc32, *p);
        p += 1;
        count -= 1;
    }
    return crc32;
}

#elif defined(__aarch64__) && defined(__linux__)
#include <arm_acle.h>
#include <sys/auxv.h>
#include <asm/hwcap.h>

int ccrc32c_available(void) { return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0; }

__attribute__((target("crc")))
uint32_t ccrc32c_update(uint32_t crc, const void *bytes, size_t count) {
    const unsigned char *p = bytes;
    while (count >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        crc = __crc32cd(crc, word);
        p += 8;
        count -= 8;
    }
    while (count > 0) {
        crc = __crc32cb(crc, *p);
        p += 1;
        count -= 1;
    }
    return crc;
}

#else

int ccrc32c_available(void) { return 0; }

uint32_t ccrc32c_update(uint32_t crc, const void *bytes, size_t count) {
    (void)bytes;
    (void)count;
    return crc;
}

#endif
