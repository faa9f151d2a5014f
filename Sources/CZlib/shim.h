#ifndef CZLIB_SHIM_H
#define CZLIB_SHIM_H
// The one header Swift sees of zlib. Only LogFormat's Gzip imports it.
#include <zlib.h>

// deflateInit2 and inflateInit2 are macros, which Swift cannot call.
static inline int czlib_deflate_init_gzip(z_streamp stream, int level) {
    // 15 + 16: a 32 KiB window, with a gzip header and trailer.
    return deflateInit2(stream, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
}

static inline int czlib_inflate_init_gzip(z_streamp stream) {
    return inflateInit2(stream, 15 + 16);
}
#endif
