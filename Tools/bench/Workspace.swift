import Foundation

/// A scratch directory for one run's stores, removed when the run ends.
struct Workspace: Sendable {
    let root: String
    /// The file system under `root`, by name, so the report shows whether
    /// an fsync there reaches a disk (`tmpfs` would make `.full` free).
    let fileSystem: String

    /// Creates a fresh `syncstore-bench-XXXXXX` directory under `base`.
    static func create(under base: String) throws -> Workspace {
        var template = Array((base as NSString).appendingPathComponent("syncstore-bench-XXXXXX").utf8CString)
        let root = template.withUnsafeMutableBufferPointer { buffer -> String? in
            guard let base = buffer.baseAddress, let made = mkdtemp(base) else { return nil }
            return String(cString: made)
        }
        guard let root else { throw BenchError("cannot create a scratch directory under \(base): errno \(errno)") }
        return Workspace(root: root, fileSystem: Workspace.fileSystemName(of: root))
    }

    /// The path of a named store (a directory or file) inside the workspace.
    func path(_ name: String) -> String { (root as NSString).appendingPathComponent(name) }

    func remove(_ name: String) { try? FileManager.default.removeItem(atPath: path(name)) }

    func removeAll() { try? FileManager.default.removeItem(atPath: root) }

    /// The bytes the files under `name` occupy.
    func sizeOfItem(_ name: String) -> Int {
        let base = path(name)
        guard let items = FileManager.default.subpaths(atPath: base) else { return 0 }
        return items.reduce(0) { total, item in
            let attributes = try? FileManager.default.attributesOfItem(atPath: (base as NSString).appendingPathComponent(item))
            return total + ((attributes?[.size] as? NSNumber)?.intValue ?? 0)
        }
    }

    /// The type of the file system holding `path`, from the longest mount
    /// point in `/proc/mounts` that contains it ("unknown" elsewhere).
    private static func fileSystemName(of path: String) -> String {
        guard let mounts = try? String(contentsOfFile: "/proc/mounts", encoding: .utf8) else { return "unknown" }
        var best = (mountPoint: "", type: "unknown")
        for line in mounts.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count >= 3 else { continue }
            let mountPoint = String(fields[1])
            let contains = mountPoint == "/" || path == mountPoint || path.hasPrefix(mountPoint + "/")
            if contains && mountPoint.count >= best.mountPoint.count { best = (mountPoint, String(fields[2])) }
        }
        return best.type
    }
}
