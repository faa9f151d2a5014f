import Foundation

/// An environment's `data.mdb` cut short while it is open, as another
/// process might cut it, and later put back whole: the one failure of an
/// environment a test can make and mend in its own process (a failed
/// commit needs a child process).
public final class DataFileCut {
    private let handle: FileHandle
    private let whole: Data

    /// Cuts `directory`'s `data.mdb` to its first `bytes` bytes, keeping
    /// what it held.
    public init(directory: String, toBytes bytes: UInt64) throws {
        let file = (directory as NSString).appendingPathComponent("data.mdb")
        whole = try Data(contentsOf: URL(fileURLWithPath: file))
        guard let handle = FileHandle(forUpdatingAtPath: file) else { throw CocoaError(.fileNoSuchFile) }
        self.handle = handle
        try handle.truncate(atOffset: bytes)
    }

    /// Writes the file back as it was before the cut.
    public func mend() throws {
        try handle.seek(toOffset: 0)
        try handle.write(contentsOf: whole)
    }

    deinit { try? handle.close() }
}
