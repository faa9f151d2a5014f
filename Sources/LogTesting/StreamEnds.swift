/// Whether `stream` ends (finishes, or throws) within `seconds`: a guard
/// that keeps a stream that never ends from hanging the run, not a measure
/// of time.
public func ends<S: AsyncSequence & Sendable>(_ stream: S, within seconds: Double = hangSeconds) async -> Bool
where S.Element: Sendable {
    await withTaskGroup(of: Bool.self) { group in
        group.addTask {
            do { for try await _ in stream {} } catch {}
            return true
        }
        group.addTask {
            try? await Task.sleep(for: .seconds(seconds))
            return false
        }
        let first = await group.next() ?? false
        group.cancelAll()
        return first
    }
}
