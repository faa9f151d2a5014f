import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Ends a child process with the process that started it, by a pipe: the
/// parent gives the child a stdin pipe and never writes to it; when the
/// parent ends, however it ends (SIGKILL too), the kernel closes its end and
/// the child reads end-of-file. No polling, and nothing Linux-only.
enum ParentWatch {
    /// Runs `action` on a thread of its own once stdin reaches its end. A
    /// stdin that cannot be read (closed, or a directory) is not watched.
    static func onStdinEnd(_ action: @escaping @Sendable () -> Void) {
        let thread = Thread {
            var buffer = [UInt8](repeating: 0, count: 512)
            // Ends at end-of-file or on an error other than an interrupt.
            while true {
                let count = buffer.withUnsafeMutableBytes { read(STDIN_FILENO, $0.baseAddress, $0.count) }
                if count == 0 { break }
                if count < 0 && errno != EINTR { return }
            }
            action()
        }
        thread.name = "parent watch"
        thread.start()
    }
}
