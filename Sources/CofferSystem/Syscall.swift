import Glibc

/// The one place Coffer makes a system call that reports failure as `-1` and `errno`.
///
/// Like NIO's `syscall(blocking:where:_:)` and swift-system's `valueOrErrno(retryOnInterrupt:)`:
/// the call is retried while it fails with EINTR; any other failure throws ``SystemError`` with
/// `errno` read immediately after the call (before anything else can overwrite it).
///
/// In debug builds a test can make a named call on a named path fail with a chosen `errno`
/// (``SyscallFaults``), so the failure paths of durable writes are exercised for real.
package enum Syscall {
    /// Runs `call` (which returns `-1` and sets `errno` on failure), retrying EINTR; returns its
    /// result or throws `SystemError(operation, path, errno:)`.
    @inline(__always)
    package static func retrying<T: FixedWidthInteger & SignedInteger>(
        _ operation: String, _ path: String, _ call: () -> T
    ) throws(SystemError) -> T {
        while true {
            #if DEBUG
            if let injected = SyscallFaults.take(operation, path) {
                if injected == EINTR { continue } // as if the call had been interrupted: retried
                throw SystemError(operation, path, errno: injected)
            }
            #endif
            let result = call()
            if result != -1 { return result }
            let e = errno
            if e == EINTR { continue }
            throw SystemError(operation, path, errno: e)
        }
    }

    /// Like ``retrying(_:_:_:)`` but not retried: an interrupted call (EINTR) returns nil, for
    /// waits and reads whose caller re-checks its deadline or stop flag before calling again (a
    /// retried `poll` would restart its whole timeout). Any other failure throws.
    @inline(__always)
    package static func interruptible<T: FixedWidthInteger & SignedInteger>(
        _ operation: String, _ path: String, _ call: () -> T
    ) throws(SystemError) -> T? {
        #if DEBUG
        if let injected = SyscallFaults.take(operation, path) {
            if injected == EINTR { return nil } // as if the call had been interrupted
            throw SystemError(operation, path, errno: injected)
        }
        #endif
        let result = call()
        if result != -1 { return result }
        let e = errno
        if e == EINTR { return nil }
        throw SystemError(operation, path, errno: e)
    }

    /// For calls that return an error number instead of setting `errno` (`pthread_*`, `sigwait`,
    /// `posix_*`): retries EINTR, throws any other non-zero result.
    @inline(__always)
    package static func returningErrorNumber(_ operation: String, _ path: String, _ call: () -> Int32) throws(SystemError) {
        #if DEBUG
        if let injected = SyscallFaults.take(operation, path) { throw SystemError(operation, path, errno: injected) }
        #endif
        while true {
            let rc = call()
            if rc == 0 { return }
            if rc == EINTR { continue }
            throw SystemError(operation, path, errno: rc)
        }
    }

    /// Like ``retrying(_:_:_:)`` but returns the failure instead of throwing it, for callers on a
    /// hot path that only want to know whether the call worked and why not (no allocation).
    @inline(__always)
    package static func result<T: FixedWidthInteger & SignedInteger>(_ call: () -> T) -> (value: T, errno: Int32) {
        while true {
            let r = call()
            if r != -1 { return (r, 0) }
            let e = errno
            if e == EINTR { continue }
            return (r, e)
        }
    }
}

#if DEBUG
/// Debug-only errno injection (swift-system's `ENABLE_MOCKING` idea): makes the `n`-th call of a
/// named operation on a named path fail with a chosen `errno`, so tests reach the failure paths of
/// durable writes (a full disk during `write`, EIO from `fsync`, a failing `rename`) without a full
/// disk. Faults are keyed by path, so tests running in parallel on their own files cannot trip
/// each other. Compiled only in debug builds: release builds contain no trace of it.
package enum SyscallFaults {
    private struct Fault { var remaining: Int; let errno: Int32 }
    private struct Count { var calls: Int }
    @safe private final class Table: @unchecked Sendable {
        // @unchecked Sendable: `faults` is only touched with `mutex` held.
        let mutex: UnsafeMutablePointer<pthread_mutex_t> = {
            let m = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
            unsafe m.initialize(to: pthread_mutex_t())
            unsafe pthread_mutex_init(m, nil)
            return unsafe m
        }()
        var faults: [String: Fault] = [:]
        var counts: [String: Count] = [:]
    }
    private static let table = Table()

    private static func key(_ operation: String, _ path: String) -> String { operation + "\u{0}" + path }

    /// Makes the `call`-th (1: the next) `operation` on `path` fail with `errno`. Operation names are
    /// the ones ``SystemError/operation`` shows: `open`, `write`, `fsync`, `rename`, `close`, ….
    /// EINTR behaves like a real interruption: ``Syscall/retrying(_:_:_:)`` retries the call,
    /// ``Syscall/interruptible(_:_:_:)`` returns nil.
    package static func inject(_ operation: String, path: String, errno: Int32, onCall call: Int = 1) {
        precondition(call >= 1)
        withTable { $0.faults[key(operation, path)] = Fault(remaining: call, errno: errno) }
    }

    /// Removes every fault armed for `path` (all of them when nil).
    package static func clear(path: String? = nil) {
        withTable { t in
            if let path { t.faults = t.faults.filter { !$0.key.hasSuffix("\u{0}" + path) } } else { t.faults = [:] }
        }
    }

    /// True if a fault for `operation` on `path` is still waiting to fire.
    package static func isArmed(_ operation: String, path: String) -> Bool {
        withTable { $0.faults[key(operation, path)] != nil }
    }

    /// Starts counting the calls of `operation` on `path` (from zero), for tests that prove a call
    /// is made only so often (one `SO_PEERCRED` read per connection). Every call counts, including
    /// a retry after EINTR.
    package static func startCounting(_ operation: String, path: String) {
        withTable { $0.counts[key(operation, path)] = Count(calls: 0) }
    }

    /// How many calls of `operation` on `path` were made since ``startCounting(_:path:)``; stops
    /// counting them. Nil if they were not being counted.
    package static func stopCounting(_ operation: String, path: String) -> Int? {
        withTable { t in
            let k = key(operation, path)
            defer { t.counts[k] = nil }
            return t.counts[k]?.calls
        }
    }

    /// The errno to fail this call with, if a fault fires now (and counts the call if asked to).
    static func take(_ operation: String, _ path: String) -> Int32? {
        withTable { t in
            if t.faults.isEmpty && t.counts.isEmpty { return nil }
            let k = key(operation, path)
            t.counts[k]?.calls += 1
            guard var f = t.faults[k] else { return nil }
            f.remaining -= 1
            if f.remaining > 0 { t.faults[k] = f; return nil }
            t.faults[k] = nil
            return f.errno
        }
    }

    private static func withTable<R>(_ body: (Table) -> R) -> R {
        unsafe pthread_mutex_lock(table.mutex)
        defer { unsafe pthread_mutex_unlock(table.mutex) }
        return body(table)
    }
}
#endif
