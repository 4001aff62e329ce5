// git-credential-coffer: git's credential helper on the Coffer keychain (issue #17).
//
//   git config --global credential.helper coffer
//
// git runs `git-credential-coffer [--socket PATH] get|store|erase` and speaks its key=value protocol
// on stdin/stdout (GitCredential in CofferCLISupport: the protocol, the item layout, the matching).
// Whatever goes wrong — no agent, a locked keychain, a refused prompt — `get` prints nothing and
// exits 0, so git goes on to its next helper or asks the person; `store` and `erase` never fail git
// either. At most one line goes to standard error, naming the error, never a secret or a value.
import CofferCLISupport
import CofferClient
import CofferCrypto
import CofferModel
import CofferSystem
import Glibc

let usage = """
    usage: git-credential-coffer [--socket PATH] (get | store | erase)

    git's credential helper on the Coffer keychain. Set it up with
        git config --global credential.helper coffer
    Credentials are internet-password items (server, protocol, port, path, account).
    See git-credential-coffer(1).
    """

/// The helper's command line: options, then git's action.
struct Invocation {
    var socket: String?
    var action: String?

    /// nil after printing usage or the version.
    init?(_ args: [String]) {
        var rest = args[...]
        while let arg = rest.first, arg.hasPrefix("-") {
            rest = rest.dropFirst()
            if arg == "--socket", let path = rest.first {
                socket = path
                rest = rest.dropFirst()
            } else if arg.hasPrefix("--socket=") {
                socket = String(arg.dropFirst("--socket=".count))
            } else if arg == "--version" {
                StandardStreams.print("git-credential-coffer 1")
                return nil
            } else if arg == "-h" || arg == "--help" {
                StandardStreams.print(usage)
                return nil
            } else {
                StandardStreams.printError("git-credential-coffer: unknown option \(TerminalSafeText.escaped(arg))\n" + usage)
                exit(2)
            }
        }
        action = rest.first
    }
}

/// One run: the request, the agent, the answer.
struct Helper {
    let request: GitCredential
    let connection: AgentConnection
    /// Nobody may be asked (an IDE, a cron job, GIT_TERMINAL_PROMPT=0): an item with an access
    /// control fails at once, and git goes on without it.
    let asksNobody: Bool

    /// Connects and sends HELLO without waiting for its reply (read with the first request's).
    static func connect(socket: String?) throws(SecError) -> AgentConnection {
        try AgentConnection(path: AgentConnection.socketPath(explicit: socket), clientName: "git-credential-coffer", pipelineHello: true)
    }

    init(request: GitCredential, connection: AgentConnection) {
        self.request = request
        self.connection = connection
        // GIT_TERMINAL_PROMPT=0 (set by go, cargo and CI scripts around git) means no terminal
        // prompt even where one could open, as git itself honours it.
        let promptsRefused = getenv("GIT_TERMINAL_PROMPT").map { GitCredential.isFalse(String(cString: $0)) } ?? false
        asksNobody = promptsRefused || !TerminalAuthentication.isAvailable
        if !asksNobody {
            // An item with an access control asks the person at git's terminal.
            connection.authenticationDelegate = TerminalAuthentication(name: "git-credential-coffer")
        }
    }

    /// The stored credentials this request matches, with their persistent references and, with
    /// `secrets`, their secrets (attributes alone never need the person).
    func candidates(secrets: Bool = false) throws(SecError) -> [ItemResult] {
        let found: [ItemResult]
        do {
            found = try connection.copyMatching(ItemQuery(itemClass: .internetPassword, attributes: request.queryAttributes, limit: .all,
                                                          returnData: secrets, returnAttributes: true, returnPersistentRef: true))
        } catch where error.status == .itemNotFound {
            return []
        }
        return found.filter { request.matches($0.attributes ?? [:]) && $0.persistentRef != nil }
    }

    func secret(of item: ItemResult) throws(SecError) -> SecureBytes {
        // The server goes with the reference so that a prompt names it ("read the secret of "HOST"").
        var attributes: Attributes = [:]
        if let server = item.attributes?["srvr"] { attributes["srvr"] = server }
        guard let data = try connection.copyMatching(ItemQuery(itemClass: .internetPassword, attributes: attributes, limit: .one, returnData: true,
                                                               persistentRef: item.persistentRef)).first?.data else {
            throw .itemNotFound()
        }
        return data
    }

    /// The best unexpired match: one for this exact path (or pathless, when git sent no path) before
    /// others, then the most recently changed; nil if none is left.
    func best(of candidates: [ItemResult]) -> ItemResult? {
        let now = Int64(time(nil))
        func rank(_ item: ItemResult) -> (Int, Double) {
            let a = item.attributes ?? [:]
            let path: String? = if case .string(let p)? = a["path"], !p.isEmpty { p } else { nil }
            let modified: Double = if case .date(let d)? = a["mdat"] { d } else { 0 }
            return (path == request.path ? 0 : 1, -modified)
        }
        return candidates.filter { item in
            (GitCredential.expiry(of: item.attributes ?? [:]).map { $0 > now } ?? true) && GitCredential.isWritable(username: username(item))
        }.min { rank($0) < rank($1) }
    }

    func username(_ item: ItemResult) -> String {
        if case .string(let u)? = item.attributes?["acct"] { u } else { request.username ?? "" }
    }

    /// `get`: the best match's username and password, for git.
    ///
    /// One request in the common case, as `coffer get`'s fetch: the search brings the matches'
    /// secrets with their attributes, behind options (pipelined, not waited for) telling the agent
    /// that nobody may be asked. So no prompt opens, and no sensor starts, for a match that might not
    /// be chosen. The secrets of the matches not chosen (other usernames on the same host, which this
    /// program may read all the same) are wiped at once; the agent's audit log records each read.
    ///
    /// If any match would need the person (an access control not satisfied within its reuse window),
    /// the agent refuses the whole search (errSecInteractionNotAllowed) and nothing is opened: the
    /// helper chooses by attributes alone, then reads only the chosen credential, asking the person at
    /// git's terminal when it has an access control and someone may be asked.
    func get() throws(SecError) {
        try connection.pipelineAuthenticationOptions(AuthenticationOptions(noUserInterface: true))
        let found: [ItemResult]
        do {
            found = try candidates(secrets: true)
        } catch where error.status == .interactionNotAllowed {
            return try getChoosingFirst()
        }
        defer { for item in found { item.data?.wipe() } }
        guard let chosen = best(of: found), let data = chosen.data else { throw .itemNotFound() }
        try answer(chosen, data)
    }

    /// `get` when a match needs the person: chosen by attributes, then only the chosen one read.
    private func getChoosingFirst() throws(SecError) {
        guard let chosen = best(of: try candidates()) else { throw .itemNotFound() }
        // The agent still may not ask anyone; it may again, to read a chosen credential that needs
        // the person, if someone is there to ask (one round trip fewer: pipelined with the read).
        if chosen.attributes?[AccessControl.attributeName] != nil && !asksNobody {
            try connection.pipelineAuthenticationOptions(AuthenticationOptions())
        }
        let data = try secret(of: chosen)
        defer { data.wipe() }
        try answer(chosen, data)
    }

    /// Writes `item`'s username and `secret` (its password, and an OAuth refresh token in git's
    /// format) for git.
    private func answer(_ item: ItemResult, _ secret: SecureBytes) throws(SecError) {
        let attrs = item.attributes ?? [:]
        guard let answer = GitCredential.answer(username: username(item), secret: secret, expiry: GitCredential.expiry(of: attrs),
                                                gitFormat: GitCredential.isGitFormat(attrs)) else {
            throw .param("the stored password holds a line break or a NUL, which git's protocol cannot carry")
        }
        defer { answer.wipe() }
        guard answer.withUnsafeBytes({ StandardStreams.write(1, $0) }) else { throw .io("cannot write to git") }
    }

    /// `store`: adds the credential, or replaces the secret (and expiry) of the same one — unless that
    /// one has an access control: git stores after every use, and replacing would ask the person a
    /// second time for what they just unlocked (such an item is changed with `coffer update`).
    ///
    /// None of these requests can need the person (the new item has no access control, and only
    /// items without one are changed), so the agent is not told first that nobody may be asked: a
    /// store is one request after HELLO, three when the credential was there already.
    func store() throws(SecError) {
        guard request.isStorable, let secret = request.encodedSecret() else { return }
        defer { secret.wipe() }
        do {
            _ = try connection.add(NewItem(itemClass: .internetPassword, attributes: request.itemAttributes, secret: secret))
        } catch where error.status == .duplicateItem {
            var changes = request.itemAttributes
            for key in ItemClass.internetPassword.primaryKey { changes[key] = nil }
            for item in try candidates() where request.isSame(item.attributes ?? [:]) && item.attributes?[AccessControl.attributeName] == nil {
                _ = try connection.update(ItemQuery(itemClass: .internetPassword, persistentRef: item.persistentRef),
                                          ItemChanges(attributes: changes, secret: secret))
            }
        }
    }

    /// `erase`: deletes every match; when git names the password (the one a server just refused),
    /// only credentials holding that password, so a newer one stored meanwhile survives.
    ///
    /// Never asks the person: git erases right after a server refused a password, and a prompt to
    /// read or delete an item with an access control then would be a surprise (and a second one for
    /// what they may have just unlocked). Such an item is compared and deleted only if the agent
    /// allows it without asking (within a reuse window); otherwise it stays, for `coffer delete`.
    func erase() throws(SecError) {
        guard request.isErasable else { return }
        try connection.pipelineAuthenticationOptions(AuthenticationOptions(noUserInterface: true))
        for item in try candidates() {
            if let wanted = request.password {
                guard let data = try? secret(of: item) else { continue }
                let stored = GitCredential.decodeSecret(data, gitFormat: GitCredential.isGitFormat(item.attributes ?? [:]))
                data.wipe()
                defer { stored.password.wipe(); stored.refreshToken?.wipe() }
                guard stored.password.constantTimeEquals(wanted) else { continue }
            }
            do {
                _ = try connection.delete(ItemQuery(itemClass: .internetPassword, persistentRef: item.persistentRef))
            } catch where [.itemNotFound, .interactionNotAllowed, .authFailed, .userCanceled].contains(error.status) {
                continue   // gone meanwhile, or protected: the others are still erased
            }
        }
    }
}

signal(SIGPIPE, SIG_IGN)
// No core file with a password in it; but the process stays dumpable, so the agent can read which
// executable it is (its signed identity, coffer.git) without CAP_SYS_PTRACE.
try? ProcessHardening.disableCoreFiles()
guard let invocation = Invocation(Array(CommandLine.arguments.dropFirst())) else { exit(0) }
guard let action = invocation.action else {
    StandardStreams.printError(usage)
    exit(2)
}
// Actions this helper does not know are ignored, as git asks of helpers.
guard ["get", "store", "erase"].contains(action) else { exit(0) }

/// git's request from standard input, in secure memory: a small buffer first, grown up to
/// ``GitCredential/maximumInputBytes``. Reading ends at the blank line that ends the request or at
/// the end of input (a caller may keep its end open, waiting for the answer). nil if it cannot be
/// read or is larger.
///
/// A request is a few dozen to a few hundred bytes: 256 bytes takes a chunk of the locked arena the
/// agent's reply and the secret share (``SecureBytes``' pool locks one 16 KiB region for a process
/// like this one; a buffer beyond 4096 bytes would lock a region of its own, docs/PERFORMANCE.md).
/// Locking a megabyte up front cost more than the whole lookup.
func readRequest() -> SecureBytes? {
    var buffer = SecureBytes(count: 256)
    var length = 0
    while true {
        if length == buffer.count {
            guard buffer.count <= GitCredential.maximumInputBytes else { return nil }
            let bigger = SecureBytes(count: min(buffer.count * 8, GitCredential.maximumInputBytes + 1))
            bigger.withUnsafeMutableBytes { b in buffer.withUnsafeBytes { b.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: length) } }
            buffer.wipe()
            buffer = bigger
        }
        let n = buffer.withUnsafeMutableBytes { b in read(0, b.baseAddress! + length, b.count - length) }
        if n < 0 && errno == EINTR { continue }
        if n < 0 { return nil }
        if n == 0 { break }
        let scanFrom = max(length - 1, 0)
        length += n
        let ended = buffer.withUnsafeBytes { b in
            (scanFrom..<length).contains { b[$0] == 0x0A && ($0 == 0 || b[$0 - 1] == 0x0A) }
        }
        if ended { break }
    }
    defer { buffer.wipe() }
    return buffer.slice(0..<length)
}

// The agent first, git's request after: HELLO goes out now, and the agent identifies this process
// (its pidfd, /proc, the executable's hash: about a tenth of a millisecond) while the request is
// read and parsed, instead of after. A failure to connect is reported only once the request has
// been read and found well-formed, as when the connection came second. (Two optionals, not a
// `Result<AgentConnection, SecError>`: building that generic type's metadata looks up SecError's
// conformance to Error by scanning the binary's conformance records, a tenth of the helper's
// instructions in callgrind.)
var connection: AgentConnection?
var connectionFailure: SecError?
do { connection = try Helper.connect(socket: invocation.socket) } catch { connectionFailure = error }

guard let input = readRequest() else {
    StandardStreams.printError("git-credential-coffer: cannot read git's request (larger than \(GitCredential.maximumInputBytes) bytes?)")
    exit(0)
}
let request: GitCredential
do {
    request = try GitCredential(parsing: input)
} catch {
    StandardStreams.printError("git-credential-coffer: git's request is malformed: \(error.description)")
    exit(0)
}
input.wipe()

do throws(SecError) {
    guard let connection else { throw connectionFailure ?? .io("no connection to the agent") }
    let helper = Helper(request: request, connection: connection)
    switch action {
    case "get": try helper.get()
    case "store": try helper.store()
    default: try helper.erase()
    }
} catch {
    // Not found and a cancelled or impossible prompt are ordinary: git asks the person. Anything
    // else gets one line, so a missing agent or a locked keychain is not a mystery.
    if ![.itemNotFound, .userCanceled, .interactionNotAllowed, .authFailed].contains(error.status) {
        StandardStreams.printError("git-credential-coffer: keychain not used: \(error.description)")
    }
}
request.password?.wipe()
request.oauthRefreshToken?.wipe()
exit(0)
