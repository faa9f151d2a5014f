import Foundation
import LogStore
import LogTesting
import Testing

/// Output that cannot be written is an I/O error (exit status 2, a message
/// naming where), not a success with a truncated file. `/dev/full` fails
/// every write with ENOSPC, as a full disk does.
@Suite struct LogToolOutputFailureTests {
    /// `logtool` with its standard output sent to `/dev/full`.
    private func runIntoFullDevice(_ arguments: [String]) async throws -> ToolRun {
        try await ToolRun.running("/bin/sh", ["-c", #"exec "$0" "$@" > /dev/full"#, Tool.path("logtool")] + arguments)
    }

    private func makeStore(_ name: String) async throws -> TemporaryDirectory {
        let directory = try TemporaryDirectory(name)
        let store = try Store(path: directory.path, options: .init(durability: .process))
        try await store.create(type: "te", id: "a", fields: ["n": 1])
        store.close()
        return directory
    }

    @Test(arguments: [["dump", "--json"], ["dump"], ["stat"], ["entities", "te"], ["export"]])
    func aCommandWhoseOutputCannotBeWrittenFails(command: [String]) async throws {
        let directory = try await makeStore("logtool-stdout-full")
        let run = try await runIntoFullDevice([command[0], directory.path] + command.dropFirst())
        #expect(run.status == 2, "\(command): \(run.errors)")
        #expect(run.errors.contains("standard output: No space left on device"), "\(command): \(run.errors)")
    }

    @Test func anExportToAFullDeviceNamesIt() async throws {
        let directory = try await makeStore("logtool-export-full")
        let run = try await Tool.run(["export", directory.path, "-o", "/dev/full"])
        #expect(run.status == 2)
        #expect(run.errors == "logtool: cannot write /dev/full: No space left on device\n", "\(run.errors)")
    }
}
