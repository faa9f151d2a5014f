import Foundation

/// The system's `gzip` tool, as a check of this package's gzip that shares
/// none of its code.
public enum GzipTool {
    /// What `gzip -dc` makes of `data`.
    /// - Throws: when the tool is missing, or refuses `data` (status not 0).
    public static func decompress(_ data: Data) throws -> Data {
        let directory = try TemporaryDirectory("gzip-tool")
        let input = directory.appending("body.gz")
        try data.write(to: URL(fileURLWithPath: input))
        guard let gzip = ToolRun.onPath("gzip") else { throw CocoaError(.fileNoSuchFile) }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: gzip)
        process.arguments = ["-dc", input]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let inflated = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { throw CocoaError(.fileReadCorruptFile) }
        return inflated
    }
}
