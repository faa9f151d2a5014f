import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Ends a tool with a message naming the data files it reads, rather than
/// a crash report, when a read through LMDB's memory map fails.
///
/// LMDB reads a store's `data.mdb` through a map of it. When the file is
/// cut short under the tool (truncated, or a shorter copy put in its
/// place) or the disk fails a read, the next read of a page past the cut
/// raises SIGBUS, as does a read that damage sends past the file's end.
/// Nothing can go on after it, as the read never returns; without a
/// handler the process dies with a backtrace that names no file.
/// `EventLog.checkDataFileWhole()` names a cut before a read, and this
/// names one that comes after a check.
///
/// The handler only writes bytes prepared beforehand and exits: all a
/// signal handler may do.
public enum MapFault {
    /// Installs the handler: from now on SIGBUS writes `toolName`'s
    /// message to standard error and ends the process with `status`.
    /// Call it once, before the first store is opened.
    /// - Parameter hint: what to do next, the message's last sentence.
    public static func install(toolName: String, status: Int32, hint: String) {
        text.withLock { text in
            text.head = "\(toolName): SIGBUS: a read through LMDB's memory map"
            text.tail =
                " failed: the data file was cut short under \(toolName) (truncated, or a shorter copy put in its "
                + "place), a damaged page points past its end, or the disk failed a read of it. \(hint)\n"
            publish(text)
        }
        exitStatus.store(status, ordering: .releasing)
        var action = sigaction()
        #if canImport(Glibc)
            action.__sigaction_handler.sa_handler = handle
        #else
            action.__sigaction_u.__sa_handler = handle
        #endif
        sigemptyset(&action.sa_mask)
        sigaction(SIGBUS, &action, nil)
    }

    /// Names the data file of the store at `directory` in the message,
    /// before the store is opened (a tool that reads two names both).
    public static func watch(storeAt directory: String) {
        let file = directory.hasSuffix("/") ? directory + "data.mdb" : directory + "/data.mdb"
        text.withLock { text in
            guard !text.files.contains(file) else { return }
            text.files.append(file)
            publish(text)
        }
    }

    private struct Text {
        var head = ""
        var files: [String] = []
        var tail = ""
    }

    private static let text = Mutex(Text())

    /// The message as the handler writes it: `length` bytes from `bytes`.
    /// Rewritten only by `publish`, which stores the new length after the
    /// bytes it covers, and only ever grows the buffer's use.
    nonisolated(unsafe) private static let bytes = UnsafeMutablePointer<UInt8>.allocate(capacity: capacity)
    private static let capacity = 16_384
    private static let length = Atomic<Int>(0)
    private static let exitStatus = Atomic<Int32>(2)

    /// Writes the message into the buffer: the head, the files (" of A or
    /// B"), the tail; cut at the buffer's end, which only a list of very
    /// long paths reaches. A handler running meanwhile (another thread's
    /// read) writes the old length's bytes, which are being written over:
    /// the message may be garbled, and the exit status is still right.
    private static func publish(_ text: Text) {
        var message = text.head
        for (index, file) in text.files.enumerated() { message += (index == 0 ? " of " : " or ") + file }
        message += text.tail
        let utf8 = Array(message.utf8.prefix(capacity))
        utf8.withUnsafeBufferPointer { source in bytes.update(from: source.baseAddress!, count: source.count) }
        length.store(utf8.count, ordering: .releasing)
    }

    private static let handle: @convention(c) (Int32) -> Void = { _ in
        let count = MapFault.length.load(ordering: .acquiring)
        var written = 0
        while written < count {
            let result = write(2, MapFault.bytes + written, count - written)
            if result <= 0 { break }
            written += result
        }
        _exit(MapFault.exitStatus.load(ordering: .acquiring))
    }
}
