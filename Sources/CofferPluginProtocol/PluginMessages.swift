package import CofferCrypto
import CofferModel

/// The agent ↔ plugin-host protocol, version 1 (see the PluginProtocol article): constants and framing.
package enum PluginWire {
    /// The protocol version this code speaks.
    package static let version: UInt16 = 1
    /// Smallest frame body: type (1) + id (4).
    package static let minimumBodyBytes = 5
    /// Largest frame body (64 KiB).
    package static let maximumBodyBytes = 64 * 1024
    /// Largest credential.
    package static let maximumCredentialBytes = 4096
    /// Bytes of a domain state.
    package static let domainStateBytes = 32
    /// Most arguments of a CONTROL.
    package static let maximumControlArguments = 16
    /// Frame header size.
    package static let headerBytes = 4

    /// The body length a header announces, or nil (a framing error: close the connection).
    package static func bodyLength(_ header: [UInt8]) -> Int? {
        guard header.count == headerBytes else { return nil }
        let n = Int(header.reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
        return (minimumBodyBytes...maximumBodyBytes).contains(n) ? n : nil
    }
}

/// A malformed message (never quotes the peer's bytes).
package struct PluginProtocolError: Error, Equatable, Sendable, CustomStringConvertible {
    package let description: String
    package init(_ description: String) { self.description = description }
}

/// LocalAuthentication's result codes, as plugins return them.
package enum LACode: Int32, Sendable, Equatable, CaseIterable {
    case success = 0, authenticationFailed = -1, userCancel = -2, userFallback = -3, systemCancel = -4
    case passcodeNotSet = -5, biometryNotAvailable = -6, biometryNotEnrolled = -7, biometryLockout = -8
}

/// The codes of an ERROR message.
package enum PluginErrorCode: Int32, Sendable {
    /// The request did not decode (or was not allowed in this state, e.g. a second HELLO).
    case malformed = 1
    /// No loaded plugin has that name.
    case unknownPlugin = 2
    /// An evaluation with that id is already running, or the host runs too many requests.
    case busy = 3
    /// HELLO named no version the host speaks.
    case version = 4
}

/// What a plugin says it is.
package struct PluginInfo: Sendable, Equatable {
    package var name: String
    package var kind: UInt8
    package var capabilities: UInt32
    package var enrolledCount: UInt32
    /// nil for a plugin without enrollment (STATUS_UNSUPPORTED).
    package var domainState: [UInt8]?
    package init(name: String, kind: UInt8, capabilities: UInt32, enrolledCount: UInt32, domainState: [UInt8]?) {
        self.name = name; self.kind = kind; self.capabilities = capabilities
        self.enrolledCount = enrolledCount; self.domainState = domainState
    }
}

/// A plugin file the host refused, and why.
package struct RefusedPlugin: Sendable, Equatable {
    package var file: String
    package var reason: String
    package init(file: String, reason: String) { self.file = file; self.reason = reason }
}

/// Why an evaluation is cancelled: the person (→ userCancel) or the agent (→ systemCancel).
package enum CancelReason: UInt8, Sendable {
    case user = 1, system = 2
    package var code: LACode { self == .user ? .userCancel : .systemCancel }
}

/// Message type codes. Never renumbered.
package enum PluginMessageType: UInt8, Sendable {
    case hello = 0x01, evaluate = 0x02, cancel = 0x03, control = 0x04, state = 0x05
    case helloReply = 0x81, result = 0x82, controlReply = 0x84, stateReply = 0x85
    case feedback = 0xC1, error = 0xFF
}

/// Messages from the agent to the host.
package enum HostRequest: Sendable {
    case hello(minVersion: UInt16, maxVersion: UInt16)
    case evaluate(plugin: String, reason: String, app: String, timeoutMillis: UInt32, credential: SecureBytes?)
    case cancel(CancelReason)
    case control(plugin: String, command: String, arguments: [String])
    case state(plugin: String)
}

/// Messages from the host to the agent.
package enum HostResponse: Sendable, Equatable {
    case helloReply(version: UInt16, plugins: [PluginInfo], refused: [RefusedPlugin])
    case result(code: Int32, domainState: [UInt8]?)
    case controlReply(code: Int32, text: String)
    case stateReply(code: Int32, enrolledCount: UInt32, domainState: [UInt8]?)
    case feedback(String)
    case error(code: Int32, message: String)
}

struct Reader {
    var r: ByteReader
    init(_ b: ArraySlice<UInt8>) { r = ByteReader(b) }
    mutating func u8(_ w: String) throws(PluginProtocolError) -> UInt8 { do { return try r.u8(w) } catch { throw .init(error.reason) } }
    mutating func u16(_ w: String) throws(PluginProtocolError) -> UInt16 { do { return try r.u16(w) } catch { throw .init(error.reason) } }
    mutating func u32(_ w: String) throws(PluginProtocolError) -> UInt32 { do { return try r.u32(w) } catch { throw .init(error.reason) } }
    mutating func i32(_ w: String) throws(PluginProtocolError) -> Int32 { Int32(bitPattern: try u32(w)) }
    mutating func raw(_ n: Int, _ w: String) throws(PluginProtocolError) -> ArraySlice<UInt8> {
        do { return try r.raw(n, w) } catch { throw .init(error.reason) }
    }
    mutating func sstr(_ w: String, max: Int = 1024, nonEmpty: Bool = false) throws(PluginProtocolError) -> String {
        let s: String
        do { s = try r.shortString(w) } catch { throw .init(error.reason) }
        guard s.utf8.count <= max else { throw .init("\(w) too long (the limit is \(max) bytes)") }
        guard !nonEmpty || !s.isEmpty else { throw .init("\(w) is empty") }
        guard !s.utf8.contains(0) else { throw .init("\(w) contains a NUL byte") }
        return s
    }
    mutating func flag(_ w: String) throws(PluginProtocolError) -> Bool {
        switch try u8(w) {
        case 0: return false
        case 1: return true
        default: throw .init("\(w) is not 0 or 1")
        }
    }
    mutating func domainState(_ w: String) throws(PluginProtocolError) -> [UInt8]? {
        try flag("\(w) flag") ? Array(try raw(PluginWire.domainStateBytes, w)) : nil
    }
    func end() throws(PluginProtocolError) {
        guard r.isAtEnd else { throw .init("trailing bytes after the message") }
    }
}

/// Longest plugin name, reason, app name, command, argument, text.
enum Limits {
    static let name = 64, reason = 512, app = 256, command = 64, argument = 256, text = 1024, file = 4096
}

extension ByteWriter {
    mutating func i32(_ v: Int32) { u32(UInt32(bitPattern: v)) }
    mutating func domainState(_ d: [UInt8]?) {
        if let d { precondition(d.count == PluginWire.domainStateBytes); u8(1); raw(d) } else { u8(0) }
    }
}

private func frame(_ type: PluginMessageType, _ id: UInt32, capacity: Int = 64, _ fill: (inout ByteWriter) -> Void) -> [UInt8] {
    var w = ByteWriter(capacity: 9 + capacity)
    w.u32(0)
    w.u8(type.rawValue)
    w.u32(id)
    fill(&w)
    w.patchU32(at: 0, UInt32(w.bytes.count - 4))
    return w.take()
}

extension HostRequest {
    /// The frame (length prefix included). A frame carrying a credential must be wiped by the sender
    /// after writing (``PluginWire`` callers use `secureZero`).
    package func encodeFrame(id: UInt32) -> [UInt8] {
        switch self {
        case let .hello(lo, hi):
            return frame(.hello, id) { $0.u16(lo); $0.u16(hi) }
        case let .evaluate(plugin, reason, app, timeout, credential):
            return frame(.evaluate, id, capacity: 64 + reason.utf8.count + app.utf8.count + (credential?.count ?? 0)) { w in
                w.shortString(plugin); w.shortString(reason); w.shortString(app); w.u32(timeout)
                if let credential {
                    w.u8(1); w.u32(UInt32(credential.count)); credential.withUnsafeBytes { w.raw($0) }
                } else { w.u8(0) }
            }
        case let .cancel(reason):
            return frame(.cancel, id) { $0.u8(reason.rawValue) }
        case let .control(plugin, command, args):
            return frame(.control, id) { w in
                w.shortString(plugin); w.shortString(command); w.u16(UInt16(args.count))
                for a in args { w.shortString(a) }
            }
        case let .state(plugin):
            return frame(.state, id) { $0.shortString(plugin) }
        }
    }

    /// Decodes a frame body (type ‖ id ‖ payload). The credential goes into `SecureBytes`; the
    /// caller wipes `body`.
    package static func decodeBody(_ body: [UInt8]) throws(PluginProtocolError) -> (id: UInt32, request: HostRequest) {
        guard body.count >= PluginWire.minimumBodyBytes else { throw .init("frame body shorter than its header") }
        let id = body[1..<5].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        var r = Reader(body[5...])
        let request: HostRequest
        switch PluginMessageType(rawValue: body[0]) {
        case .hello:
            let lo = try r.u16("minVersion"), hi = try r.u16("maxVersion")
            request = .hello(minVersion: lo, maxVersion: hi)
        case .evaluate:
            let plugin = try r.sstr("plugin name", max: Limits.name, nonEmpty: true)
            let reason = try r.sstr("reason", max: Limits.reason, nonEmpty: true)
            let app = try r.sstr("app name", max: Limits.app)
            let timeout = try r.u32("timeoutMillis")
            guard timeout > 0 else { throw .init("timeoutMillis is zero") }
            var credential: SecureBytes? = nil
            if try r.flag("hasCredential") {
                let n = Int(try r.u32("credential length"))
                guard n <= PluginWire.maximumCredentialBytes else {
                    throw .init("credential too long (the limit is \(PluginWire.maximumCredentialBytes) bytes)")
                }
                let bytes = try r.raw(n, "credential")
                let s = SecureBytes(count: n)
                s.withUnsafeMutableBytes { dst in bytes.withUnsafeBytes { dst.copyMemory(from: $0) } }
                credential = s
            }
            request = .evaluate(plugin: plugin, reason: reason, app: app, timeoutMillis: timeout, credential: credential)
        case .cancel:
            guard let reason = CancelReason(rawValue: try r.u8("cancel reason")) else { throw .init("unknown cancel reason") }
            request = .cancel(reason)
        case .control:
            let plugin = try r.sstr("plugin name", max: Limits.name, nonEmpty: true)
            let command = try r.sstr("command", max: Limits.command, nonEmpty: true)
            let n = Int(try r.u16("argument count"))
            guard n <= PluginWire.maximumControlArguments else {
                throw .init("too many arguments (the limit is \(PluginWire.maximumControlArguments))")
            }
            var args: [String] = []
            for _ in 0..<n { args.append(try r.sstr("argument", max: Limits.argument)) }
            request = .control(plugin: plugin, command: command, arguments: args)
        case .state:
            request = .state(plugin: try r.sstr("plugin name", max: Limits.name, nonEmpty: true))
        case nil, .helloReply, .result, .controlReply, .stateReply, .feedback, .error:
            throw .init("unknown or reply message type")
        }
        try r.end()
        return (id, request)
    }
}

extension HostResponse {
    /// The frame (length prefix included).
    package func encodeFrame(id: UInt32) -> [UInt8] {
        switch self {
        case let .helloReply(version, plugins, refused):
            return frame(.helloReply, id, capacity: 256) { w in
                w.u16(version); w.u16(UInt16(plugins.count))
                for p in plugins {
                    w.shortString(p.name); w.u8(p.kind); w.u32(p.capabilities); w.u32(p.enrolledCount); w.domainState(p.domainState)
                }
                w.u16(UInt16(refused.count))
                for r in refused { w.shortString(r.file); w.shortString(r.reason) }
            }
        case let .result(code, state):
            return frame(.result, id) { $0.i32(code); $0.domainState(state) }
        case let .controlReply(code, text):
            return frame(.controlReply, id) { $0.i32(code); $0.shortString(text) }
        case let .stateReply(code, count, state):
            return frame(.stateReply, id) { $0.i32(code); $0.u32(count); $0.domainState(state) }
        case let .feedback(text):
            return frame(.feedback, id) { $0.shortString(text) }
        case let .error(code, message):
            return frame(.error, id) { $0.i32(code); $0.shortString(message) }
        }
    }

    /// Decodes a frame body (type ‖ id ‖ payload).
    package static func decodeBody(_ body: [UInt8]) throws(PluginProtocolError) -> (id: UInt32, response: HostResponse) {
        guard body.count >= PluginWire.minimumBodyBytes else { throw .init("frame body shorter than its header") }
        let id = body[1..<5].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        var r = Reader(body[5...])
        let response: HostResponse
        switch PluginMessageType(rawValue: body[0]) {
        case .helloReply:
            let version = try r.u16("version")
            var plugins: [PluginInfo] = []
            for _ in 0..<Int(try r.u16("plugin count")) {
                let name = try r.sstr("plugin name", max: Limits.name, nonEmpty: true)
                let kind = try r.u8("kind"), caps = try r.u32("capabilities"), count = try r.u32("enrolledCount")
                plugins.append(PluginInfo(name: name, kind: kind, capabilities: caps, enrolledCount: count,
                                          domainState: try r.domainState("domainState")))
            }
            var refused: [RefusedPlugin] = []
            for _ in 0..<Int(try r.u16("refused count")) {
                refused.append(RefusedPlugin(file: try r.sstr("file", max: Limits.file), reason: try r.sstr("reason", max: Limits.text)))
            }
            response = .helloReply(version: version, plugins: plugins, refused: refused)
        case .result:
            response = .result(code: try r.i32("code"), domainState: try r.domainState("domainState"))
        case .controlReply:
            response = .controlReply(code: try r.i32("code"), text: try r.sstr("text", max: Limits.text))
        case .stateReply:
            response = .stateReply(code: try r.i32("code"), enrolledCount: try r.u32("enrolledCount"),
                                   domainState: try r.domainState("domainState"))
        case .feedback:
            response = .feedback(try r.sstr("text", max: Limits.text))
        case .error:
            response = .error(code: try r.i32("code"), message: try r.sstr("message", max: Limits.text))
        case nil, .hello, .evaluate, .cancel, .control, .state:
            throw .init("unknown or request message type")
        }
        try r.end()
        return (id, response)
    }
}

/// Text for people from a plugin or the host, bounded and with control characters other than
/// newline escaped (a plugin must not be able to forge log lines or terminal escapes).
package func sanitizedText(_ s: String, max: Int = 1024) -> String {
    var out = ""
    for u in s.unicodeScalars {
        if u == "\n" || (u.value >= 0x20 && u.value != 0x7f && !(0x80..<0xa0).contains(u.value)) {
            out.unicodeScalars.append(u)
        } else {
            out += "\\x" + String(u.value, radix: 16)
        }
        if out.utf8.count > max - 8 { out += "…"; break }
    }
    return out
}
