@testable import CofferSocketServer
import CofferCrypto
import CofferKeychain
import CofferModel
import CofferService

// A toy second front end (issue #25): a line protocol on its own listener of the same agent, reaching
// identity → policy → authentication → keychain through the service core and nothing else.
//
//     GET SERVICE ACCOUNT [GROUP]   →   OK VALUE   |   ERR STATUS MESSAGE
//
// Its clients cannot prompt, so the authentication channel is the agent's own (`channel`; a script here).

/// One request per line (at most 1 KiB; a secret may be in it, so it is read into secure memory).
struct LineFraming: Framing {
    func readFrame(from conn: Connection, greeted: Bool, budget: FrameBudget, bufferedOnly: Bool) -> Result<Connection.Frame, Connection.ReadEnd> {
        conn.readLine(maximumBytes: 1024, greeted: greeted, budget: budget, bufferedOnly: bufferedOnly)
    }
}

/// The line protocol's side of a connection.
struct LineFrontEnd: ConnectionHandler {
    let service: KeychainService
    /// The agent-side authentication channel for one request (nil: nobody can be asked).
    let channel: @Sendable () -> (any AuthChannel)?

    func serve(_ conn: Connection, caller: CallerIdentity, server: SocketServer) {
        var context = CallerContext(caller: caller)
        server.serveRequests(conn, firstFrame: "request") { body in
            let words = body.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }.split(separator: " ").map(String.init)
            var reply = answer(words, &context)
            defer { secureZero(&reply) }
            return conn.send(reply)
        }
    }

    /// The reply line to one request.
    private func answer(_ words: [String], _ context: inout CallerContext) -> [UInt8] {
        guard words.first == "GET", words.count == 3 || words.count == 4 else {
            return Array("ERR \(SecStatus.param.rawValue) usage: GET SERVICE ACCOUNT [GROUP]\n".utf8)
        }
        var attributes: Attributes = ["svce": .string(words[1]), "acct": .string(words[2])]
        if words.count == 4 { attributes["agrp"] = .string(words[3]) }
        service.noteActivity()
        do {
            let query = ItemQuery(itemClass: .genericPassword, attributes: attributes, returnData: true)
            return try service.search(query, &context, channel()) { (page) throws(SecError) -> [UInt8] in
                guard let data = page.items.first?.data else { throw .itemNotFound() }
                return Array("OK ".utf8) + data.withUnsafeBytes { Array($0) } + [UInt8(ascii: "\n")]
            }
        } catch {
            return Array("ERR \(error.status.rawValue) \(error.message)\n".utf8)
        }
    }
}
