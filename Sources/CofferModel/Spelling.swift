/// The nearest of a set of names to a mistyped one: "did you mean" for commands, options and
/// configuration keys.
package enum Spelling {
    /// Levenshtein distance over characters (insert, delete, substitute: 1 each).
    package static func distance(_ a: String, _ b: String) -> Int {
        let a = Array(a), b = Array(b)
        guard !a.isEmpty else { return b.count }
        var previous = Array(0...b.count)
        for i in 1...a.count {
            var current = [i] + Array(repeating: 0, count: b.count)
            for j in stride(from: 1, through: b.count, by: 1) {
                current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1))
            }
            previous = current
        }
        return previous[b.count]
    }

    /// The name of `names` nearest to `word` (the only one it begins, or one within a third of its
    /// length in edits); nil when none is near.
    package static func nearest(_ word: String, among names: [String]) -> String? {
        let prefixed = names.filter { $0.hasPrefix(word) }
        if prefixed.count == 1 { return prefixed[0] }
        guard let best = names.min(by: { distance(word, $0) < distance(word, $1) }) else { return nil }
        return distance(word, best) <= max(1, best.count / 3) ? best : nil
    }
}
