import CofferModel
import CofferSystem
import Glibc

/// Failed application-password attempts per item, so that an item's password cannot be guessed
/// online faster than the passcode: the same kind of schedule as the unlock throttle (free tries,
/// then growing waits), kept per item and persisted in the state directory
/// (``fileName``), keyed by the item's persistent reference (random, set when the item is added,
/// kept by every update: nothing a caller can change).
///
/// Each attempt is written down, and fsynced, as failed *before* the password is checked (Argon2id),
/// so a kill mid-check still counts it; a success resets the item's count; an attempt made before the
/// delay has passed is refused at once (errSecAuthFailed with the time to wait), not counted and
/// without running Argon2id. Wall-clock time, so the waits hold across restarts.
///
/// The file: `coffer app-password-attempts v1\n`, then one line per item with failures,
/// `REF FAILURES LAST\n` (REF: the persistent reference in lowercase hex; LAST: wall-clock seconds of
/// the last failure). A line whose REF is `*` holds for every item without a line of its own: what a
/// damaged file becomes (fail closed: damaging the file must not earn attempts). It holds until its
/// wait has passed, and is dropped from the file at the next write after that (with the zero lines
/// it kept), so a damaged file heals: each item then counts from zero again.
///
/// ``erase()`` (the keychain erased) deletes the file and forgets every count.
///
/// Callers hold the keychain's mutex, which serialises the checks; the state has its own lock too.
package final class ApplicationPasswordAttempts: Sendable {
    package static let fileName = "app-password-attempts"
    static let header = "coffer app-password-attempts v1"
    /// The file's size limit (about 60,000 items with failures); a larger file counts as damaged.
    static let maximumBytes = 4 << 20

    struct Count: Sendable, Equatable {
        var failures: Int
        var lastFailure: Double
    }

    /// `delays[k - 1]`: seconds the attempt after the k-th failure in a row waits (the last entry
    /// holds for every later one); the agent passes its unlock schedule's.
    let delays: [Double]
    private let path: String?
    private let clock: any MonotonicClock
    private let counts: Protected<[String: Count]>
    /// Set by ``erase()``: nothing is written any more.
    private let erased = Protected(false)

    init(path: String?, delays: [Double], clock: any MonotonicClock) {
        self.path = path
        self.delays = delays
        self.clock = clock
        counts = Protected(path.map { Self.read($0, delays: delays, now: clock.now()) } ?? [:])
    }

    /// The standard schedule: attempts 1–4 free, then 1 min, 5 min, 15 min, 15 min, 1 h.
    package static let standardDelays: [Double] = [0, 0, 0, 60, 300, 900, 900, 3600]

    func delay(afterFailures failures: Int) -> Double {
        guard failures > 0, !delays.isEmpty else { return 0 }
        return delays[min(failures, delays.count) - 1]
    }

    /// Failed attempts in a row on the item with persistent reference `ref`.
    func failures(ref: [UInt8]) -> Int { counts.withLock { count(Hex.encode(ref), in: $0).failures } }

    /// Runs `check` (the item's decryption with the password) as one counted attempt on item `ref`;
    /// `report` hears of a failure or an early refusal.
    func attempt<T>(ref: [UInt8], report: (ApplicationPasswordAttempt.Outcome) -> Void,
                    _ check: () throws(SecError) -> T) throws(SecError) -> T {
        let key = Hex.encode(ref)
        let now = clock.now()
        let before = counts.withLock { count(key, in: $0) }
        let wait = before.lastFailure + delay(afterFailures: before.failures) - now
        if wait > 0 {
            report(.refused(failures: before.failures, wait: wait))
            throw SecError(.authFailed, "too many failed attempts at this item's application password (\(before.failures)): "
                + "try again in \(Self.duration(wait))")
        }
        let pending = Count(failures: before.failures + 1, lastFailure: now)
        try store(key, pending)
        do {
            let value = try check()
            try? store(key, Count(failures: 0, lastFailure: 0))
            return value
        } catch where error.status == .authFailed {
            report(.failed(failures: pending.failures, nextDelay: delay(afterFailures: pending.failures)))
            throw error
        } catch {
            // Not a wrong password (a locked class, a damaged row): nothing to count.
            try? store(key, before)
            throw error
        }
    }

    /// Forgets deleted items.
    func forget(refs: [[UInt8]]) {
        let keys = refs.map { Hex.encode($0) }
        guard counts.withLock({ c in keys.contains { c[$0] != nil } }) else { return }
        for key in keys { try? store(key, nil) }
    }

    /// Forgets every count and deletes the file (the keychain is erased); later attempts write nothing.
    func erase() {
        counts.withLock { c in
            erased.withLock { $0 = true }
            c = [:]
            if let path { _ = unsafe unlink(path) }
        }
    }

    private func count(_ key: String, in c: [String: Count]) -> Count {
        c[key] ?? live(c["*"]) ?? Count(failures: 0, lastFailure: 0)
    }

    /// The `*` line while its wait has not passed (nil after).
    private func live(_ star: Count?) -> Count? {
        guard let star, star.lastFailure + delay(afterFailures: star.failures) > clock.now() else { return nil }
        return star
    }

    /// Sets (nil or zero: removes, unless a `*` line needs it kept at zero) one item's count and writes
    /// the file (atomically, fsynced) before returning; on a write error the count is unchanged.
    private func store(_ key: String, _ value: Count?) throws(SecError) {
        try counts.withLock { (c: inout [String: Count]) throws(SecError) in
            var next = c
            if next["*"] != nil, live(next["*"]) == nil { // its wait has passed: the damaged file heals
                next["*"] = nil
                next = next.filter { $0.value.failures > 0 }
            }
            if let value, value.failures > 0 || next["*"] != nil { next[key] = value } else { next[key] = nil }
            guard next != c else { return } // nothing to write (a success on an item without failures)
            if let path, !erased.withLock({ $0 }) {
                do { try Files.writeAtomically(path, Self.encode(next), mode: 0o600) } catch {
                    throw SecError(.io, "cannot record the application-password attempt: \(error)")
                }
            }
            c = next
        }
    }

    static func encode(_ c: [String: Count]) -> [UInt8] {
        var text = header + "\n"
        for (k, v) in c.sorted(by: { $0.key < $1.key }) { text += "\(k) \(v.failures) \(v.lastFailure)\n" }
        return Array(text.utf8)
    }

    /// Reads the file: empty if missing; a damaged file is a `*` line with as many failures as the
    /// schedule knows, just now.
    static func read(_ path: String, delays: [Double], now: Double) -> [String: Count] {
        let damaged = ["*": Count(failures: max(delays.count, 1), lastFailure: now)]
        let bytes: [UInt8]
        do { bytes = try Files.read(path, maxBytes: maximumBytes) } catch {
            return error.errno == ENOENT ? [:] : damaged
        }
        guard bytes.last == UInt8(ascii: "\n") else { return damaged }
        let lines = String(decoding: bytes, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).dropLast()
        guard lines.first == Substring(header) else { return damaged }
        var out: [String: Count] = [:]
        for line in lines.dropFirst() {
            let w = line.split(separator: " ", omittingEmptySubsequences: false)
            guard w.count == 3, w[0] == "*" || (w[0].utf8.count == 32 && Hex.decode(String(w[0])) != nil),
                  let n = Int(w[1]), n >= 0, let t = Double(w[2]), t.isFinite, out[String(w[0])] == nil else { return damaged }
            out[String(w[0])] = Count(failures: n, lastFailure: t)
        }
        return out
    }

    /// "45 s", "5 min", "1 h" (as the unlock throttle says it).
    package static func duration(_ seconds: Double) -> String {
        let s = Int(seconds.rounded(.up))
        if s < 120 { return "\(s) s" }
        if s < 7200 { return "\((s + 59) / 60) min" }
        return "\((s + 3599) / 3600) h"
    }
}
