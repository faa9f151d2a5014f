// The product apps import: `import SyncStore` brings the store API and the
// format's value types. Tools and tests import the modules they need.
@_exported import LogFormat
@_exported import LogStore
