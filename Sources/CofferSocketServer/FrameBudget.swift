import CofferCrypto
import CofferProtocol
import CofferSystem
import Glibc

/// Locked memory for large frame bodies, shared by all connections.
///
/// Frame bodies are read into locked memory because they may carry secrets. Small ones come from
/// the secure pool; a large one (up to ``WireFormat/maximumLargeBodyBytes``, 1.5 MiB at version 4) is a
/// dedicated locked region. Without a cap, 64 clients each sending a 256 KiB frame would ask for 16 MiB
/// of locked memory, twice the usual RLIMIT_MEMLOCK, and push key material out of it. So large bodies
/// draw on this budget (a quarter of the lock budget, at least one maximal frame): a frame that does not
/// fit waits for others to finish (the rest of it stays in the socket buffer: backpressure), and
/// a connection that cannot get its budget within the I/O timeout is closed.
///
/// What one client may hold is capped twice: a connection holds at most one frame's budget at a
/// time, for at most the frame deadline (``Connection/Limits/frameSeconds``), and all connections
/// of one process (peer pid) together hold at most ``perOwnerCap`` (half the budget, at least one
/// maximal frame), so one process dripping large frames on many connections cannot take it all.
package final class FrameBudget: Sendable {
    /// What is free, and what each owner holds; waiters sleep on its condition variable.
    private let state: Protected<Holdings>
    /// Total bytes the budget holds.
    package let capacity: Int
    /// Most bytes one owner may hold at once.
    let perOwnerCap: Int

    private struct Holdings {
        var available: Int
        /// Bytes held per owner (peer pid).
        var held: [Int32: Int] = [:]
    }

    /// Bodies at most this large come from the secure pool and need no budget.
    static let poolServedBytes = 4096

    init(capacity: Int) {
        self.capacity = capacity
        perOwnerCap = min(capacity, max(WireFormat.maximumLargeBodyBytes, capacity / 2))
        state = Protected(Holdings(available: capacity))
    }

    /// The default: a quarter of the process's lock budget, and room for at least one maximal frame.
    package static func standard() -> FrameBudget {
        let lockBudget = SecureMemory.lockBudget ?? (8 << 20)
        return FrameBudget(capacity: max(WireFormat.maximumLargeBodyBytes, lockBudget / 4))
    }

    /// What ``acquire(_:owner:timeout:)`` granted: give it back with ``release(_:)``.
    package struct Grant: Sendable {
        let bytes: Int
        let owner: Int32
        static let none = Grant(bytes: 0, owner: 0)
    }

    /// Takes `bytes` (0 for a pool-served body) for `owner`, waiting up to `timeout` seconds for
    /// enough to be free and for `owner` to stay within ``perOwnerCap``; nil on timeout.
    func acquire(_ bytes: Int, owner: Int32, timeout: Double) -> Grant? {
        guard bytes > 0 else { return Grant.none }
        let need = min(bytes, capacity)
        let cap = perOwnerCap
        return state.withLock(waitingUntil: { $0.available >= need && $0.held[owner, default: 0] + need <= cap },
                              timeout: timeout) { s in
            s.available -= need
            s.held[owner, default: 0] += need
            return Grant(bytes: need, owner: owner)
        }
    }

    /// Returns what ``acquire(_:owner:timeout:)`` granted.
    package func release(_ grant: Grant) {
        guard grant.bytes > 0 else { return }
        state.withLock { s in
            s.available += grant.bytes
            let left = s.held[grant.owner, default: 0] - grant.bytes
            s.held[grant.owner] = left > 0 ? left : nil
        }
        state.broadcast()
    }

    /// The budget a body of `length` bytes needs (0 when the secure pool serves it).
    static func cost(ofBody length: Int) -> Int { length > poolServedBytes ? length : 0 }
}
