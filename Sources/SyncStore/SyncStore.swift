// The product apps import: `import SyncStore` brings the store API, the
// sync engine and the format's value types. Tools and tests import the
// modules they need.
@_exported import LogFormat
@_exported import LogStore
@_exported import LogSync
@_exported import LogSyncHTTP
