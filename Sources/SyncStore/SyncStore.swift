// The product apps import: `import SyncStore` brings the store API, the
// sync engine and the format's value types, and `LMDBError`, which the
// store's calls throw (a second open, a failed environment, a full map),
// without the rest of the LMDB wrapper. Tools and tests import the modules
// they need.
@_exported import struct LMDB.DatabaseStatistics
@_exported import struct LMDB.LMDBError
@_exported import LogFormat
@_exported import LogStore
@_exported import LogSync
@_exported import LogSyncHTTP
