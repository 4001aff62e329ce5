import CofferModel
import CofferSystem
import Logging

/// The open connections of every listener and what shutdown needs: per-process counts (the admission
/// limits, across all listeners), the requests in flight, and the stopping flag, all owned by one mutex. Shutdown waits on its condition
/// variable for the requests in flight to finish.
final class ConnectionRegistry: Sendable {
    private struct State {
        var connections: [ObjectIdentifier: Connection] = [:]
        /// Open connections per peer pid (pid 0: unknown, shared).
        var perProcess: [Int32: Int] = [:]
        /// Requests between ``beginRequest()`` and ``endRequest()``.
        var inFlight = 0
        var stopping = false
    }

    private let state = Protected(State())
    let maxConnections: Int
    let maxPerProcess: Int

    init(maxConnections: Int, maxPerProcess: Int) {
        self.maxConnections = maxConnections
        self.maxPerProcess = maxPerProcess
    }

    /// Whether a new connection was taken in.
    enum Admission { case admitted, stopping, full, processFull }

    /// Takes `conn` in unless the agent is stopping or a limit is reached.
    func admit(_ conn: Connection) -> Admission {
        state.withLock { s in
            guard !s.stopping else { return .stopping }
            guard s.connections.count < maxConnections else { return .full }
            guard s.perProcess[conn.peer.pid, default: 0] < maxPerProcess else { return .processFull }
            s.connections[ObjectIdentifier(conn)] = conn
            s.perProcess[conn.peer.pid, default: 0] += 1
            return .admitted
        }
    }

    /// Removes a finished connection.
    func forget(_ conn: Connection) {
        state.withLock { s in
            _ = s.connections.removeValue(forKey: ObjectIdentifier(conn))
            let left = s.perProcess[conn.peer.pid, default: 1] - 1
            s.perProcess[conn.peer.pid] = left > 0 ? left : nil
        }
    }

    /// Open connections.
    var count: Int { state.withLock { $0.connections.count } }

    /// True once ``stop()`` was called.
    var isStopping: Bool { state.withLock { $0.stopping } }

    /// Counts a request in flight; false once stopping (the request must not run).
    func beginRequest() -> Bool {
        state.withLock { s in
            guard !s.stopping else { return false }
            s.inFlight += 1
            return true
        }
    }

    /// Ends what ``beginRequest()`` began; wakes ``drain(timeout:)`` when the last one ends.
    func endRequest() {
        let last: Bool = state.withLock { s in
            s.inFlight -= 1
            return s.inFlight == 0 && s.stopping
        }
        if last { state.broadcast() }
    }

    /// Refuses new connections and requests from now on; returns the open connections.
    func stop() -> [Connection] {
        state.withLock { s in
            s.stopping = true
            return Array(s.connections.values)
        }
    }

    /// Waits (on the condition variable, no polling) until no request is in flight; false after `timeout` seconds.
    func drain(timeout: Double) -> Bool {
        state.withLock(waitingUntil: { $0.inFlight == 0 }, timeout: timeout) { _ in true } ?? false
    }

    /// Sends `event` to every subscriber, whatever its listener, in its front end's encoding, without
    /// waiting; a subscriber that stopped reading is dropped.
    func broadcast(_ event: LockEvent, refusals: RefusalLog) {
        let subscribers = state.withLock { $0.connections.values.filter { $0.isSubscribed } }
        for c in subscribers {
            guard let frame = c.eventFrame(event), !c.sendEvent(frame) else { continue }
            refusals.log("subscriber", "dropping a subscriber that stopped reading", peer: c.peer)
            c.close()
        }
    }
}
