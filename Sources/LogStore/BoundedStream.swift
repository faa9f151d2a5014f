import Synchronization

/// An asynchronous sequence that holds at most `countMax` unread values for
/// its reader. Past that it drops later values, counts them, and yields one
/// value made by its `missed` closure where they would have been, so the
/// reader learns that it fell behind, and by how much, at the point where
/// it did. It ends when its source finishes (after the values it holds), or
/// at once when its reader's task is cancelled.
public struct BoundedStream<Element: Sendable>: AsyncSequence, Sendable {
    public typealias Failure = Never

    let buffer: Buffer
    /// Rings once per value put in `buffer`; holds one ring at most, since a
    /// ring only says "look in the buffer".
    let doorbell: AsyncStream<Void>

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(buffer: buffer, doorbell: doorbell.makeAsyncIterator())
    }

    public struct AsyncIterator: AsyncIteratorProtocol {
        public typealias Failure = Never

        let buffer: Buffer
        var doorbell: AsyncStream<Void>.Iterator

        public mutating func next() async -> Element? {
            // Every value put rings once after it, so each pass returns a
            // value or takes a ring: the loop ends by the next ring's value
            // at the latest (a ring may come for a value a pass took before).
            while !Task.isCancelled {
                if let value = buffer.take() { return value }
                // Finished: the values still held, one a call, then nil.
                guard await doorbell.next() != nil else { return Task.isCancelled ? nil : buffer.take() }
            }
            return nil
        }
    }

    /// The unread values of one stream.
    final class Buffer: Sendable {
        private enum Item {
            case value(Element)
            /// Values dropped after the one before it.
            case missed(Int)
        }

        private struct State {
            /// At most `countMax` values, each run of values dropped between
            /// them counted in one `missed` item: `2 * countMax + 1` items at most.
            var items: [Item] = []
            var valueCount = 0
        }

        private let state = Mutex(State())
        let countMax: Int
        private let missed: @Sendable (Int) -> Element

        init(countMax: Int, missed: @escaping @Sendable (Int) -> Element) {
            precondition(countMax > 0, "a bounded stream must hold a value")
            self.countMax = countMax
            self.missed = missed
        }

        func put(_ value: Element) {
            state.withLock { state in
                if state.valueCount < countMax {
                    state.items.append(.value(value))
                    state.valueCount += 1
                } else if case .missed(let count) = state.items.last {
                    state.items[state.items.count - 1] = .missed(count + 1)
                } else {
                    state.items.append(.missed(1))
                }
            }
        }

        func take() -> Element? {
            let item: Item? = state.withLock { state in
                guard !state.items.isEmpty else { return nil }
                let item = state.items.removeFirst()
                if case .value = item { state.valueCount -= 1 }
                return item
            }
            switch item {
            case .value(let value): return value
            case .missed(let count): return missed(count)
            case nil: return nil
            }
        }

        /// Drops what the stream holds (its reader was cancelled).
        func removeAll() { state.withLock { $0 = State() } }
    }
}
