import CofferModel
import CofferService
import CofferSystem

/// One native connection's conversation state, owned by the thread serving it (a value: nothing else
/// sees it, so it needs no lock): the wire state (HELLO's version and client name, lock-event
/// subscription, closing) here, and the caller with its authorization state in ``context``, which the
/// service core (CofferService) reads and updates.
struct Session: Sendable {
    /// Who connected (SO_PEERCRED at accept time, and /proc/PID/exe).
    let peer: PeerIdentity
    /// The caller and what this connection has been authorized to do (the core's state).
    var context: CallerContext
    /// The caller's identity, established once when the connection was accepted (CofferIdentity), or
    /// the delegated process's once a DELEGATE was accepted.
    var caller: CallerIdentity { context.caller }
    /// The front end that delegated this connection (the identity the connection was accepted
    /// with), once a DELEGATE was accepted; nil otherwise.
    private(set) var delegatedBy: CallerIdentity? = nil
    /// The delegated process's start time as DELEGATE named it (checked then): reading anything of
    /// that process later first makes sure its pid was not reused. (Its display is not read: the
    /// agent's dialogs appear on the login session's, ``AgentPromptChannel/promptDisplay(_:loginctl:)``.)
    private(set) var delegatedStartTime: UInt64? = nil
    /// True once a request after HELLO was read (DELEGATE or any other, a malformed one included):
    /// DELEGATE is allowed only before that.
    private(set) var hasRequestAfterHello = false
    /// The protocol version agreed in HELLO; nil until HELLO was accepted.
    private(set) var protocolVersion: UInt16? = nil
    /// The client's self-description from HELLO (for logs; never trusted).
    private(set) var clientName: String? = nil
    /// The events the client asked for (the serving thread subscribes its connection to them).
    var eventTopics: EventTopics = []
    /// True once the connection must close after the reply now being sent (a refused HELLO): nothing
    /// after it runs, not even requests the client already pipelined behind it.
    private(set) var mustClose = false

    init(peer: PeerIdentity, caller: CallerIdentity) {
        self.peer = peer
        context = CallerContext(caller: caller)
    }

    /// True once HELLO was accepted.
    var isGreeted: Bool { protocolVersion != nil }

    /// Records an accepted HELLO.
    mutating func greeted(version: UInt16, clientName: String) {
        protocolVersion = version
        self.clientName = clientName
    }

    /// Notes a request read after HELLO (call before handling it; HELLO itself is not one).
    mutating func noteRequestAfterHello() { hasRequestAfterHello = true }

    /// From now on the connection's caller is `delegate` (its access groups, never the front end's),
    /// with a fresh authorization state. The front end's identity is kept in ``delegatedBy``.
    mutating func delegate(to delegate: CallerIdentity, startTime: UInt64) {
        delegatedBy = context.caller
        delegatedStartTime = startTime
        context = CallerContext(caller: delegate, delegated: true)
    }

    /// Ends the conversation after the current reply.
    mutating func close() { mustClose = true }
}
