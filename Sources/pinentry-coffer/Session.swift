import CofferClient
import CofferCrypto
import CofferPrompt
import CofferModel
import CofferSystem
import Glibc

/// One gpg-agent conversation (the Assuan pinentry protocol on stdin and stdout).
///
/// OPTIONs and SET… settings are answered here and remembered; the wrapped pinentry is started only
/// when the person must be asked, and gets them replayed first (after a RESET if it showed a dialog
/// of ours or the settings changed). GETINFO is answered here. GETPIN with a cache id (SETKEYINFO,
/// and gpg-agent's `OPTION allow-external-password-cache`) and no SETERROR is answered from the
/// keychain when the passphrase is stored there; otherwise the wrapped pinentry asks and the answer
/// may be saved. Everything else goes to the wrapped pinentry, its replies (data, status, INQUIRE,
/// ERR, OK) back unchanged.
final class Session {
    static let version = "0.1.0"
    /// GPG_ERR_SOURCE_PINENTRY's GPG_ERR_ASS_GENERAL: the wrapped pinentry could not be run or died.
    static let cannotAsk = "ERR 83886337 General IPC error <Pinentry>"
    /// GPG_ERR_SOURCE_PINENTRY's GPG_ERR_NOT_SUPPORTED.
    static let notSupported = "ERR 83886140 Not supported <Pinentry>"

    let config: Configuration
    let agent = LineChannel(input: 0, output: 1)
    let store: PassphraseStore
    private(set) var wrapped: WrappedPinentry?

    /// OPTION lines by option name, in the order they came.
    private var options: [(name: String, line: String)] = []
    /// SET… lines by keyword, in the order they came.
    private var settings: [(keyword: String, line: String)] = []
    private var keyInfo: String?
    private var errorText: String?
    private var allowExternalCache = false
    private var repeatWanted = false
    /// The wrapped pinentry's state no longer matches `options` and `settings`.
    private var wrappedStale = true
    /// The cache id whose stored passphrase this session handed out or saved (a SETERROR for it
    /// means the stored one is wrong).
    private var vouchedFor: String?
    private var reportedWrappedFailure = false

    init(config: Configuration) {
        self.config = config
        store = PassphraseStore(socket: config.socket)
        store.authenticationDelegate = WrappedPinentryAuthentication(session: self)
    }

    /// Serves gpg-agent until BYE or the end of its input; the exit status.
    func run() -> Int32 {
        agent.send("OK Pleased to meet you, process \(getpid())")
        while let line = agent.readLine() {
            let more = handle(line)
            line.wipe()
            if !more { break }
        }
        wrapped?.stop()
        store.authenticationDelegate = nil
        return 0
    }

    private func handle(_ line: SecureBytes) -> Bool {
        let keyword = AssuanLine.keyword(line)
        if keyword.isEmpty || keyword.hasPrefix("#") { return true }
        // A command longer than a line may be: dropped whole, refused here (never forwarded).
        if AssuanLine.text(line) == LineChannel.tooLong {
            agent.send(LineChannel.tooLong)
            return true
        }
        switch keyword {
        case "BYE":
            agent.send("OK closing connection")
            return false
        case "NOP":
            agent.send("OK")
        case "OPTION":
            let text = AssuanLine.text(line)
            let arg = AssuanLine.argument(text)
            let name = String(arg.prefix { $0 != "=" && $0 != " " }).lowercased()
            if name == "allow-external-password-cache" { allowExternalCache = true }
            options.removeAll { $0.name == name }
            options.append((name, text))
            wrappedStale = true
            agent.send("OK")
        case "RESET":
            settings.removeAll()
            keyInfo = nil
            errorText = nil
            repeatWanted = false
            wrappedStale = true
            agent.send("OK")
        case "GETINFO":
            getInfo(AssuanLine.argument(AssuanLine.text(line)))
        case "GETPIN":
            getPin(line)
        case "CONFIRM", "MESSAGE":
            _ = forward(line, capturingData: false)
            dialogShown()
        case "CLEARPASSPHRASE":
            // gpg-agent's clear_passphrase: forget the stored one too.
            let id = AssuanLine.argument(AssuanLine.text(line))
            if !id.isEmpty { store.delete(id) }
            agent.send("OK")
        case _ where keyword.hasPrefix("SET"):
            remember(keyword, AssuanLine.text(line))
            agent.send("OK")
        default:
            _ = forward(line, capturingData: false)
        }
        return true
    }

    private func remember(_ keyword: String, _ text: String) {
        let arg = AssuanLine.argument(text)
        switch keyword {
        case "SETKEYINFO": keyInfo = arg.isEmpty || arg == "--clear" ? nil : arg
        case "SETERROR": errorText = arg.isEmpty ? nil : arg
        case "SETREPEAT": repeatWanted = true
        default: break
        }
        settings.removeAll { $0.keyword == keyword }
        settings.append((keyword, text))
        wrappedStale = true
    }

    /// After GETPIN, CONFIRM or MESSAGE: pinentry shows an error once.
    private func dialogShown() {
        errorText = nil
        settings.removeAll { $0.keyword == "SETERROR" }
    }

    private func getInfo(_ what: String) {
        func option(_ name: String) -> String {
            guard let line = options.first(where: { $0.name == name })?.line else { return "-" }
            let arg = AssuanLine.argument(line)
            guard let eq = arg.firstIndex(of: "=") else { return "-" }
            let v = String(arg[arg.index(after: eq)...])
            return v.isEmpty ? "-" : Assuan.escape(v).replacingSpaces()
        }
        switch what {
        case "flavor": agent.send("D coffer")
        case "version": agent.send("D \(Self.version)")
        case "pid": agent.send("D \(getpid())")
        case "ttyinfo": agent.send("D \(option("ttyname")) \(option("ttytype")) \(option("display"))")
        default:
            agent.send(Self.notSupported)
            return
        }
        agent.send("OK")
    }

    // MARK: GETPIN

    private func getPin(_ line: SecureBytes) {
        defer { dialogShown() }
        let cacheID = allowExternalCache && !repeatWanted ? keyInfo : nil
        var offerSave = cacheID != nil
        if let id = cacheID {
            if errorText != nil {
                // The last answer was wrong: if it was the stored one, it goes.
                if vouchedFor == id {
                    store.delete(id)
                    vouchedFor = nil
                }
            } else {
                switch store.lookup(id) {
                case .found(let pin):
                    defer { pin.wipe() }
                    vouchedFor = id
                    agent.send("S PASSWORD_FROM_CACHE")
                    sendData(pin)
                    agent.send("OK")
                    return
                case .notFound: break
                case .unavailable: offerSave = false
                }
            }
        }
        guard case .ok(let answer) = forward(line, capturingData: true) else { return }
        let pin = answer ?? SecureBytes(count: 0)
        defer { pin.wipe() }
        if let id = cacheID, offerSave, pin.count > 0, wantsSave() {
            if store.save(id, pin, label: label()) { vouchedFor = id }
        }
        sendData(pin)
        agent.send("OK")
    }

    private func sendData(_ data: SecureBytes) {
        let lines = Assuan.dataLines(data)
        agent.sendRaw(lines)
        lines.wipe()
    }

    /// save = always / never, or ask the person (a CONFIRM in the wrapped pinentry).
    private func wantsSave() -> Bool {
        switch config.save {
        case .never: return false
        case .always: return true
        case .ask:
            guard let w = prepareOwnDialog() else { return false }
            let description = "Save this passphrase in Coffer?\n\n\(label())\n\n"
                + "Coffer then gives it to gpg-agent without asking (while your keychain is unlocked)."
            for c in ["SETTITLE Coffer", "SETDESC " + Assuan.escape(description), "SETOK _Save", "SETCANCEL _Don't save"] {
                w.transact(c)
            }
            return w.transact("CONFIRM")
        }
    }

    /// The item's label: the key's user id from SETDESC (the quoted line gpg-agent puts there), else
    /// SETDESC's first line. Never the passphrase.
    func label() -> String {
        guard let desc = settings.first(where: { $0.keyword == "SETDESC" }).map({ Assuan.unescape(AssuanLine.argument($0.line)) }) else {
            return "GnuPG passphrase"
        }
        let lines = desc.split(separator: "\n").map { $0.trimmingSpaces() }
        let uid = lines.first { $0.hasPrefix("\"") && $0.hasSuffix("\"") && $0.count > 2 }.map { String($0.dropFirst().dropLast()) }
        let text = uid ?? lines.first ?? ""
        return "GnuPG: " + String(text.prefix(200))
    }

    // MARK: The wrapped pinentry

    enum Forwarded {
        /// OK; the decoded data when it was captured.
        case ok(SecureBytes?)
        case failed
    }

    /// Sends `line` to the wrapped pinentry and relays its reply to gpg-agent (an INQUIRE with
    /// gpg-agent's answer to it); with `capturingData`, D lines are kept (decoded) instead, and the
    /// final OK is left to the caller.
    private func forward(_ line: SecureBytes, capturingData: Bool) -> Forwarded {
        guard let w = prepareWrapped(), let channel = w.channel, channel.send(line) else {
            agent.send(Self.cannotAsk)
            return .failed
        }
        var pieces: [SecureBytes] = []
        defer { for p in pieces { p.wipe() } }
        while let reply = channel.readLine() {
            defer { reply.wipe() }
            if AssuanLine.isData(reply) {
                if capturingData { pieces.append(AssuanLine.data(reply)) } else { agent.send(reply) }
                continue
            }
            switch AssuanLine.keyword(reply) {
            case "OK":
                guard capturingData else { agent.send(reply); return .ok(nil) }
                return .ok(SecureBytes(concatenating: pieces))
            case "ERR":
                agent.send(reply)
                return .failed
            case "INQUIRE":
                agent.send(reply)
                relayInquiry(to: channel)
            default:
                agent.send(reply) // S status lines, comments
            }
        }
        w.stop()
        agent.send(Self.cannotAsk)
        return .failed
    }

    /// gpg-agent's answer to an INQUIRE (D lines, then END or CAN), passed to the wrapped pinentry.
    private func relayInquiry(to channel: LineChannel) {
        while let line = agent.readLine() {
            defer { line.wipe() }
            channel.send(line)
            let k = AssuanLine.keyword(line)
            if k == "END" || k == "CAN" { return }
        }
    }

    /// The wrapped pinentry, running, with gpg-agent's options and settings; nil if it cannot run.
    func prepareWrapped() -> WrappedPinentry? {
        guard let (w, fresh) = startWrapped() else { return nil }
        if wrappedStale {
            if !fresh { w.transact("RESET") }
            for o in options where o.name != "allow-external-password-cache" { w.transact(o.line) }
            for s in settings { w.transact(s.line) }
            wrappedStale = false
        }
        return w.isRunning ? w : nil
    }

    /// The wrapped pinentry with gpg-agent's options only (the terminal, the display), for a dialog of
    /// pinentry-coffer's own; gpg-agent's settings come back before its next dialog.
    func prepareOwnDialog() -> WrappedPinentry? {
        guard let (w, fresh) = startWrapped() else { return nil }
        if !fresh { w.transact("RESET") }
        for o in options where o.name != "allow-external-password-cache" { w.transact(o.line) }
        wrappedStale = true
        return w.isRunning ? w : nil
    }

    /// Starts the wrapped pinentry if it is not running; true in `fresh` if it was just started.
    private func startWrapped() -> (WrappedPinentry, fresh: Bool)? {
        guard let program = config.wrapped else {
            reportWrapped("no pinentry to wrap: set --pinentry, COFFER_PINENTRY_WRAPPED or pinentry = in pinentry.conf")
            return nil
        }
        let w = wrapped ?? WrappedPinentry(program: program, arguments: config.wrappedArguments)
        wrapped = w
        if w.isRunning { return (w, false) }
        guard w.start() else {
            reportWrapped("cannot run the wrapped pinentry \(program)")
            return nil
        }
        return (w, true)
    }

    private func reportWrapped(_ message: String) {
        guard !reportedWrappedFailure else { return }
        reportedWrappedFailure = true
        StandardStreams.printError("pinentry-coffer: " + message)
    }
}

extension String {
    /// Spaces as `%20` (a value inside a space-separated GETINFO answer).
    func replacingSpaces() -> String {
        var out = ""
        for c in self { if c == " " { out += "%20" } else { out.append(c) } }
        return out
    }
}
