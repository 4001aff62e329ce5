import CofferModel
import CofferSystem
import Glibc

/// The identities the resolver established, by pinned process (issue #42: "1 identity resolution per
/// process"): the identity part of the agent's caller-session registry (the grants are
/// `CallerSessions`'). A front end opens a connection per client and another for each prompt, and
/// every one of them would otherwise resolve the front end itself again (and, with DELEGATE, the
/// client): the flatpak-info read, the executable's hash and the manifests.
///
/// An identity is reused only for the same process and only while everything it rested on still
/// reads the same, read afresh through the pinned process on every connection:
/// - the process: uid, pid and start time (a pid that comes back belongs to a process with another
///   start time: a recreated pid never inherits another's identity);
/// - the running executable: the path `/proc/PID/exe` names, and the open file's device, inode,
///   size, mtime and ctime (an exec of another file, a rename, a rewrite in place all miss);
/// - the process is not traced (a traced process is resolved afresh, and is unsigned; what it had
///   before is forgotten, so it is resolved afresh after the tracer leaves too);
/// - the login session and what makes it unique (the leader's start time, the audit session), and
///   whether the process is in a nested pid namespace;
/// - the trust roots: a reload of the manifests (``ManifestSource/generation``) ends every entry.
///
/// What is not re-read is what cannot change for a process that keeps its executable: its sandbox
/// (a Flatpak app cannot leave its sandbox; a process that makes itself a new root keeps the
/// identity it had, never a sandbox's). An executable changed within the hash cache's racy window
/// is not remembered (as its hash is not). Entries are few (one per client process); the oldest go
/// first beyond ``capacity``.
package final class KnownProcesses: Sendable {
    /// What a resolution read of a process, which must read the same for its identity to be reused.
    package struct Evidence: Equatable, Sendable {
        let executablePath: [UInt8]
        let file: ExecutableHashCache.Key
        let sessionID: Int32?
        let session: CallerIdentity.LoginSession?
        let nested: Bool

        init(executablePath: [UInt8], status: stat, sessionID: Int32?, session: CallerIdentity.LoginSession?, nested: Bool) {
            self.executablePath = executablePath
            file = ExecutableHashCache.Key(status)
            self.sessionID = sessionID
            self.session = session
            self.nested = nested
        }
    }

    /// A process as nothing else can be: uid, pid and start time.
    struct Process: Hashable {
        let uid: UInt32, pid: Int32, startTime: UInt64
    }

    private struct Entry {
        let evidence: Evidence
        let generation: UInt64
        let identity: CallerIdentity
        let order: UInt64
    }

    /// Most processes remembered.
    package let capacity: Int
    private let state = Protected((entries: [Process: Entry](), next: UInt64(0), reused: UInt64(0)))

    package init(capacity: Int = 512) {
        precondition(capacity > 0)
        self.capacity = capacity
    }

    /// The identity established for this process, if `evidence` and the trust roots' `generation`
    /// are what they were then.
    func identity(uid: UInt32, pid: Int32, startTime: UInt64, evidence: Evidence, generation: UInt64) -> CallerIdentity? {
        state.withLock { s in
            guard let e = s.entries[Process(uid: uid, pid: pid, startTime: startTime)], e.generation == generation,
                  e.evidence == evidence else { return nil }
            s.reused &+= 1
            return e.identity
        }
    }

    /// Remembers `identity`, established from `evidence` under the trust roots' `generation`.
    func remember(_ identity: CallerIdentity, uid: UInt32, pid: Int32, startTime: UInt64, evidence: Evidence, generation: UInt64) {
        state.withLock { s in
            let key = Process(uid: uid, pid: pid, startTime: startTime)
            if s.entries[key] == nil, s.entries.count >= capacity {
                // The oldest half goes (one sort per capacity/2 new processes).
                let cut = s.entries.values.map(\.order).sorted()[s.entries.count / 2]
                s.entries = s.entries.filter { $0.value.order >= cut }
            }
            s.next &+= 1
            s.entries[key] = Entry(evidence: evidence, generation: generation, identity: identity, order: s.next)
        }
    }

    /// Forgets what was established for this process: it was seen traced (a tracer may have changed
    /// its memory, so what it was before is not what it is after the tracer leaves).
    func forget(uid: UInt32, pid: Int32, startTime: UInt64) {
        _ = state.withLock { $0.entries.removeValue(forKey: Process(uid: uid, pid: pid, startTime: startTime)) }
    }

    /// How many processes are remembered.
    package var count: Int { state.withLock { $0.entries.count } }

    /// How many connections were given a remembered identity (not resolved again).
    package var reused: UInt64 { state.withLock { $0.reused } }
}
