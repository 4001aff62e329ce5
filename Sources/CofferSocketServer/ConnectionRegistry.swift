package import CofferModel
import CofferSystem
import Logging

/// The open connections of every listener and what shutdown needs: per-process counts (the admission
/// limits, across all listeners), the requests in flight, and the stopping flag, all owned by one mutex. Shutdown waits on its condition
/// variable for the requests in flight to finish.
package final class ConnectionRegistry: Sendable {
    private struct State {
        var connections: [ObjectIdentifier: Connection] = [:]
        /// Open connections per process (pid 0: unknown, shared): the peer's pid, or for a delegated
        /// connection the pid of the process it acts for (``account(_:to:)``).
        var perProcess: [Int32: Int] = [:]
        /// The pid each connection is counted under.
        var countedAs: [ObjectIdentifier: Int32] = [:]
        /// Requests between ``beginRequest()`` and ``endRequest()``.
        var inFlight = 0
        var stopping = false
    }

    private let state = Protected(State())
    let maxConnections: Int
    package let maxPerProcess: Int

    package init(maxConnections: Int, maxPerProcess: Int) {
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
            s.countedAs[ObjectIdentifier(conn)] = conn.peer.pid
            return .admitted
        }
    }

    /// Removes a finished connection.
    func forget(_ conn: Connection) {
        state.withLock { s in
            _ = s.connections.removeValue(forKey: ObjectIdentifier(conn))
            guard let pid = s.countedAs.removeValue(forKey: ObjectIdentifier(conn)) else { return }
            let left = s.perProcess[pid, default: 1] - 1
            s.perProcess[pid] = left > 0 ? left : nil
        }
    }

    /// Counts `conn` under process `pid` from now on instead of its peer: a front end's connection
    /// delegated to the process it serves (DELEGATE) uses that process's allowance, not the front
    /// end's, so that one client process of a front end cannot use up what every other client of it
    /// shares. False, and nothing changed, when `pid` already has ``maxPerProcess`` connections.
    package func account(_ conn: Connection, to pid: Int32) -> Bool {
        state.withLock { s in
            let id = ObjectIdentifier(conn)
            guard let from = s.countedAs[id] else { return false }
            guard from != pid else { return true }
            guard s.perProcess[pid, default: 0] < maxPerProcess else { return false }
            let left = s.perProcess[from, default: 1] - 1
            s.perProcess[from] = left > 0 ? left : nil
            s.perProcess[pid, default: 0] += 1
            s.countedAs[id] = pid
            return true
        }
    }

    /// Open connections.
    var count: Int { state.withLock { $0.connections.count } }

    /// True once ``stop()`` was called.
    package var isStopping: Bool { state.withLock { $0.stopping } }

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
    package func stop() -> [Connection] {
        state.withLock { s in
            s.stopping = true
            return Array(s.connections.values)
        }
    }

    /// Waits (on the condition variable, no polling) until no request is in flight; false after `timeout` seconds.
    package func drain(timeout: Double) -> Bool {
        state.withLock(waitingUntil: { $0.inFlight == 0 }, timeout: timeout) { _ in true } ?? false
    }

    /// Sends `event` to every subscriber, whatever its listener, in its front end's encoding, without
    /// waiting; a subscriber that stopped reading is dropped.
    package func broadcast(_ event: LockEvent, refusals: RefusalLog) {
        let subscribers = state.withLock { $0.connections.values.filter { $0.isSubscribed } }
        for c in subscribers {
            guard let frame = c.eventFrame(event), !c.sendEvent(frame) else { continue }
            refusals.log("subscriber", "dropping a subscriber that stopped reading", peer: c.peer)
            c.close()
        }
    }
}
