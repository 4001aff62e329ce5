import Glibc

/// Synchronous signal handling: block signals in every thread, then take them one at a time on a
/// dedicated thread with `sigwait` (no async-signal-safety pitfalls).
package enum Signals {
    private static func set(_ signals: [Int32]) -> sigset_t {
        var s = sigset_t()
        unsafe sigemptyset(&s)
        for sig in signals { unsafe sigaddset(&s, sig) }
        return s
    }

    /// Blocks `signals` in the calling thread and every thread it starts afterwards; ignores SIGPIPE.
    package static func block(_ signals: [Int32]) {
        signal(SIGPIPE, SIG_IGN)
        var s = set(signals)
        unsafe pthread_sigmask(SIG_BLOCK, &s, nil)
    }

    /// Waits for one of `signals` (which must be blocked) and returns it.
    package static func wait(_ signals: [Int32]) -> Int32 {
        var s = set(signals)
        var sig: Int32 = 0
        while unsafe sigwait(&s, &sig) != 0 {}
        return sig
    }
}
