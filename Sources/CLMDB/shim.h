#ifndef CLMDB_SHIM_H
#define CLMDB_SHIM_H
// The one header Swift sees of liblmdb. Only the LMDB module (and the raw
// baseline in Tools/bench) import it; everything else goes through LMDB.
#include <lmdb.h>
#endif
