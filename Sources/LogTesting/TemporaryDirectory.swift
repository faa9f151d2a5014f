import Foundation

/// A fresh directory under the system temporary directory, removed with
/// everything in it when `remove()` is called or the value is released.
public final class TemporaryDirectory: Sendable {
    public let path: String

    /// - Parameter name: a readable part of the directory name, for people
    ///   looking at leftovers after a crash.
    public init(_ name: String = "syncstore") throws {
        let template = NSTemporaryDirectory() + "\(name)-XXXXXX"
        var bytes = Array(template.utf8CString)
        guard let made = mkdtemp(&bytes) else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: template])
        }
        path = String(cString: made)
    }

    /// A path inside the directory (not created).
    public func appending(_ component: String) -> String {
        (path as NSString).appendingPathComponent(component)
    }

    public func remove() {
        try? FileManager.default.removeItem(atPath: path)
    }

    deinit { remove() }
}
