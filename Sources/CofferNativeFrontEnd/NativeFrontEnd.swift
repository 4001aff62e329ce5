import CofferCrypto
import CofferModel
import CofferProtocol
import CofferService
import CofferSocketServer
import CofferSystem
import Glibc
package import Logging

/// The native protocol's framing: a 4-byte big-endian length, then the body (WireProtocol.md).
package struct NativeFraming: Framing {
    package init() {}

    func readFrame(from conn: Connection, greeted: Bool, budget: FrameBudget, bufferedOnly: Bool) -> Result<Connection.Frame, Connection.ReadEnd> {
        let maximum = conn.maximumBody ?? WireFormat.maximumBodyBytes
        return conn.readLengthPrefixedFrame(headerBytes: 4, bodyLength: { header in
            guard case .success(let n) = WireFormat.bodyLength(header: header, maximum: maximum) else { return nil }
            return n
        }, greeted: greeted, budget: budget, bufferedOnly: bufferedOnly)
    }
}

/// The native protocol as a front end of a ``SocketServer``: reads frames, decodes them, runs each
/// through the ``Pipeline`` (the adapter onto the service core) with the connection's ``Session``,
/// writes the reply; AUTH_NEEDED / AUTH_RESPONSE go over the connection itself
/// (``ConnectionAuthChannel``), and a subscribed connection gets lock events as EVENT frames.
package struct NativeFrontEnd: ConnectionHandler {
    let pipeline: Pipeline
    let logger: Logger

    package init(pipeline: Pipeline, logger: Logger) {
        self.pipeline = pipeline
        self.logger = logger
    }

    /// Reads frames until the peer closes, breaks framing or misses a deadline, or the pipeline
    /// closes the session. The session is this thread's alone.
    ///
    /// A complete request runs even if its client is gone: once a reply cannot be sent (the client
    /// closed, or stopped reading for ``Connection/ioTimeout``), the frames already in the socket
    /// still run, without replies, and the connection ends at the first one not wholly there. So
    /// HELLO + ADD written at once and followed by a close adds the item (WireProtocol, lifecycle).
    func serve(_ conn: Connection, caller: CallerIdentity, server: SocketServer) {
        var session = Session(peer: conn.peer, caller: caller)
        var replying = true
        while true {
            let frame: Connection.Frame
            switch server.readFrame(conn, greeted: session.isGreeted, replying: replying) {
            case .success(let f): frame = f
            case .failure(let end):
                server.reportEnd(end, of: conn, firstFrame: "HELLO")
                return
            }
            defer { server.release(frame) }
            guard let sent = server.request({ handle(frame: frame, session: &session, on: conn, server: server, replying: replying) })
            else { return }
            if session.mustClose { return }
            if !sent { replying = false }
        }
    }

    /// Decodes one frame body, runs it through the pipeline, sends the reply. False if the reply could not be sent.
    /// `replying` false: run the request but send nothing (an earlier reply could not be sent).
    /// Descriptors passed with the frame (`SCM_RIGHTS`) go to a DELEGATE only; any other frame's are
    /// closed before its reply is sent.
    private func handle(frame: Connection.Frame, session: inout Session, on conn: Connection, server: SocketServer, replying: Bool) -> Bool {
        let budget = server.budget
        let body = frame.body
        let wasGreeted = session.isGreeted
        let firstAfterHello = wasGreeted && !session.hasRequestAfterHello
        if session.isGreeted { session.noteRequestAfterHello() }
        let requestID: UInt32
        let request: AgentRequest
        do {
            (requestID, request) = try body.withUnsafeBytes { b throws(ProtocolError) in try AgentRequest.decodeBody(b) }
        } catch {
            frame.descriptors.closeAll()
            let id = body.withUnsafeBytes { WireFormat.requestID(ofBody: $0) } ?? 0
            let response = pipeline.refuse(error, session: &session)
            // A DELEGATE that does not decode closes like every refused DELEGATE: the front end must
            // not go on under its own identity.
            if body.withUnsafeBytes({ $0.first }) == MessageType.delegate.rawValue { session.close() }
            return replying && reply(response, id: id, on: conn)
        }
        if case .delegate(let pid, let startTime) = request, session.isGreeted {
            // From here the connection counts against the process it acts for (a refused DELEGATE
            // closes it, so a pid that was not the caller's is counted only until then). A caller not
            // entitled to delegate is refused by the pipeline before it learns anything of `pid`.
            guard session.delegatedBy != nil || !session.caller.mayDelegate || server.registry.account(conn, to: pid) else {
                frame.descriptors.closeAll()
                session.close()
                let response = AgentResponse.error(SecError(.allocate, "the process to act for already has "
                    + "\(server.registry.maxPerProcess) connections to the agent (max-connections-per-process)"))
                return replying && reply(response, id: requestID, on: conn)
            }
            let response = pipeline.delegate(pid: pid, startTime: startTime, descriptors: frame.descriptors,
                                             firstAfterHello: firstAfterHello, session: &session)
            return replying && reply(response, id: requestID, on: conn)
        }
        // Closed before the reply goes out: once a client has its reply, the agent holds nothing it passed.
        frame.descriptors.closeAll()
        if case .authResponse = request, session.isGreeted {
            // An answer to an authentication that already ended (the person touched the sensor while
            // typing): nothing waits for it, and it gets no reply. Its passcode is wiped with the frame.
            // As a first frame it is refused like any other frame that is not HELLO (lifecycle rule 1).
            return replying
        }
        let channel = ConnectionAuthChannel(conn: conn, requestID: requestID, budget: budget,
                                            feedbackKinds: (session.protocolVersion ?? 0) >= WireFormat.feedbackKindVersion)
        let response = pipeline.handle(request, session: &session, channel: replying ? channel : nil)
        if channel.broken { session.close() }
        // The HELLO sets the connection's frame limit, once: 1.5 MiB both ways at version 4 (its reply
        // is small either way).
        if !wasGreeted, session.isGreeted { conn.maximumBody = WireFormat.maximumBodyBytes(version: session.protocolVersion) }
        if !session.eventTopics.isEmpty, conn.subscribedTopics != session.eventTopics {
            conn.subscribe(to: session.eventTopics) { AgentResponse.event($0).encodeFrame(requestID: 0) }
        }
        guard replying else { return false } // never encoded: a secret in it stays in secure memory
        return reply(response, id: requestID, on: conn)
    }

    private func reply(_ response: AgentResponse, id: UInt32, on conn: Connection) -> Bool {
        var frame = response.encodeFrame(requestID: id)
        defer { if response.carriesSecret { secureZero(&frame) } }
        guard frame.count - 4 <= conn.maximumBody ?? WireFormat.maximumBodyBytes else {
            // Never reached by design (each reply is sized before it is built); a last guard, so the
            // agent never sends a frame the client must refuse.
            logger.error("a reply exceeded the frame limit", metadata: ["bytes": "\(frame.count - 4)", "peer": "\(conn.peer)"])
            return conn.send(AgentResponse.error(Pipeline.tooLarge("the reply")).encodeFrame(requestID: id))
        }
        return conn.send(frame)
    }
}

/// The person behind a connection, reached through AUTH_NEEDED / AUTH_RESPONSE on the connection
/// itself while the request waits (WireProtocol.md, Authentication).
final class ConnectionAuthChannel: AuthChannel {
    let conn: Connection
    let requestID: UInt32
    let budget: FrameBudget
    /// The client's HELLO announced version 2: feedback goes out as AUTH_FEEDBACK_KIND.
    let feedbackKinds: Bool
    /// The client sent something other than AUTH_RESPONSE mid-conversation: the connection closes
    /// after the request's reply.
    private(set) var broken = false

    init(conn: Connection, requestID: UInt32, budget: FrameBudget, feedbackKinds: Bool) {
        self.conn = conn
        self.requestID = requestID
        self.budget = budget
        self.feedbackKinds = feedbackKinds
    }

    func ask(_ request: AuthenticationRequest) { _ = conn.send(AgentResponse.authNeeded(request).encodeFrame(requestID: requestID)) }

    func feedback(_ text: String, kind: AuthFeedbackKind) {
        _ = conn.send(AgentResponse.authFeedback(text, kind: feedbackKinds ? kind : nil).encodeFrame(requestID: requestID))
    }

    func awaitAnswer(stop: () -> Bool, wake: Int32, deadline: Double) -> ChannelEvent {
        while true {
            if stop() { return .stopped }
            if Threads.monotonicSeconds() >= deadline { return .timedOut }
            guard let ready = try? Poll.readable([conn.fd, wake], timeoutMillis: 1000), ready[0] else { continue }
            let frame: Connection.Frame
            switch conn.readFrame(greeted: true, budget: budget) {
            case .success(let f): frame = f
            case .failure: return .gone
            }
            defer { budget.release(frame.grant) }
            let decoded = frame.body.withUnsafeBytes { b in Result { () throws(ProtocolError) in try AgentRequest.decodeBody(b) } }
            switch decoded {
            case .success((let id, .authResponse(let answer))) where id == requestID:
                return .answer(answer)
            case .success((_, .authResponse)):
                continue // a late answer to an earlier request
            default:
                broken = true
                return .gone
            }
        }
    }
}
