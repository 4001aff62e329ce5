public import CofferCrypto
public import CofferModel

/// A client → agent message.
public enum AgentRequest: Sendable {
    /// HELLO: the first message; the agent picks a version in min...max.
    case hello(minVersion: UInt16, maxVersion: UInt16, clientName: String)
    /// STATUS.
    case status
    /// PROTECTIONS: which device key and attempt counting are active (issue #28).
    case protections
    /// PROMPTER: the agent's own prompter, why it is that one, and where its dialogs appear (issue #43).
    case prompter
    /// COUNTERS: what the agent has done since it started (issue #42: what an action costs, measured).
    case counters
    /// UNLOCK with the passcode.
    case unlock(passcode: SecureBytes)
    /// LOCK.
    case lock
    /// SET_PASSCODE: `current` is empty when no passcode is set yet.
    case setPasscode(current: SecureBytes, new: SecureBytes)
    /// ADD (SecItemAdd) and which parts of the new item to return.
    case add(NewItem, ReturnFlags)
    /// COPY_MATCHING (SecItemCopyMatching): the whole result in one ITEMS reply, or
    /// errSecAllocate if it does not fit in one frame.
    case copyMatching(ItemQuery)
    /// COPY_MATCHING_PAGE: the next page of a search, the matches after `cursor` (0: from the
    /// start) that fit in one ITEMS_PAGE reply.
    case copyMatchingPage(ItemQuery, cursor: UInt64)
    /// UPDATE (SecItemUpdate): changes every match. The query's `limit` must be `.all` or left at
    /// its default (`.one`, sent as all: "no limit given"); `.count(n)` is sent as given and refused
    /// by the agent (errSecParam). Its return flags are not sent (the reply is a count), so the
    /// query of a lookup can be reused. On the wire, limit all and no return flags are the rule.
    case update(ItemQuery, ItemChanges)
    /// DELETE (SecItemDelete): deletes every match; the query follows the rules of ``update(_:_:)``.
    case delete(ItemQuery)
    /// SUBSCRIBE to lock-state events (an empty body).
    case subscribe
    /// SUBSCRIBE_EVENTS: lock events, item changes, or both (WireProtocol.md, Events).
    case subscribeTo(EventTopics)
    /// WHOAMI: the identity the agent gives this connection's process.
    case whoami
    /// AUTHORIZE: the user's passcode (checked through PAM) lets the shell helper use `accessGroup`
    /// for the rest of this connection (and the agent's reuse window, if configured).
    case authorize(accessGroup: String, passcode: SecureBytes)
    /// AUTH_OPTIONS: how this connection's later requests may authenticate (an `LAContext`).
    case authOptions(AuthenticationOptions)
    /// AUTH_RESPONSE: the answer to the AUTH_NEEDED of the request with the same id.
    case authResponse(AuthenticationAnswer)
    /// LA_CAN_EVALUATE: whether `policy` could be evaluated now (no person involved).
    case laCanEvaluate(LAPolicy)
    /// LA_EVALUATE: authenticate the person for `policy`, showing `reason` (not empty).
    case laEvaluate(LAPolicy, reason: String)
    /// BIO: `coffer bio enroll|remove|present|status` (`name` empty for presentUnknown and status).
    case bio(BioOperation, name: String)
    /// PASSCODE_SYNC: with nil, ask whether the keybag passcode and the login password differ (COUNT
    /// 1 or 0); with the old passcode, re-wrap the keybag under the login password (OK).
    case passcodeSync(oldPasscode: SecureBytes?)
    /// REMOVE_PASSCODE: removes the passcode given the current one (WhenPasscodeSet items are deleted).
    case removePasscode(current: SecureBytes)
    /// ESCROW create (the person authenticates; reply ESCROW_SECRET), unlock with the secret, or
    /// revoke with the passcode (OK).
    case escrowCreate
    case escrowUnlock(secret: SecureBytes)
    case escrowRevoke(passcode: SecureBytes)
    /// BACKUP: the agent writes a backup of every eligible item to `path` (absolute) under `password`
    /// (`create`), or merges the backup at `path` (`restore`, `dryRun`: report only). The person
    /// authenticates first (the Authentication conversation).
    case backupCreate(path: String, password: SecureBytes)
    case backupRestore(path: String, password: SecureBytes, dryRun: Bool)
    /// CHECK: verify every item, quarantine those failing authentication, list or restore the quarantine.
    case check(CheckOperation)
    /// CHECK_PAGE: one page of a verify, quarantine or quarantine listing, starting after `cursor`.
    case checkPage(CheckOperation, cursor: UInt64)
    /// KEY_CREATE: a key item made in the agent (SecKeyCreateRandomKey: `key` empty, its algorithm in
    /// `attributes`' `type` and `bsiz`) or imported through it (`key`: the private key in the ssh-agent
    /// wire form). The key is non-extractable: the reply never carries its private half.
    case keyCreate(KeyCreation, attributes: Attributes, ReturnFlags)
    /// KEY_SIGN: a signature of `data` by the private key item the query names (one match, no return
    /// flags), a key made or imported in the agent (KEY_CREATE), after the caller's access groups, the
    /// keybag's lock and the key's access control allowed it; the person is asked on this connection
    /// (AUTH_NEEDED), so an evaluation it holds covers the signature. `flags`: the ssh-agent protocol's
    /// signature flags (2 rsa-sha2-256, 4 rsa-sha2-512; 0 for the other key types).
    case keySign(ItemQuery, data: [UInt8], flags: UInt32)
    /// SESSION: a login session of the user opened (true) or closed (pam_coffer's open and close_session).
    case loginSession(opened: Bool)
    /// NOTE_ACCESS: on a delegated connection, the front end tells the agent what its client did with
    /// an item the front end holds itself (the Secret Service's `session` collection, in its memory),
    /// so the audit log has it under the client's identity.
    case noteAccess(NotedAccess)
    /// DELEGATE: a front end (a caller whose manifest grants `delegate-identity`) hands the agent,
    /// as the first request after HELLO, the process it serves: a pidfd passed with `SCM_RIGHTS`
    /// beside this frame, and the pid and start time (field 22 of `/proc/PID/stat`, clock ticks after
    /// boot) the front end read for it, which the agent checks again through the pidfd. From then on
    /// the connection's caller is that process (WireProtocol.md, Delegated identity).
    case delegate(pid: Int32, startTime: UInt64)
    /// PROMPT_UNLOCK: on a delegated connection only, the agent asks the person for the passcode with
    /// its own prompter (the configured pinentry, naming the delegated app) and unlocks the keybag with
    /// it as UNLOCK does; OK once unlocked, else the ERROR (userCanceled when the person cancelled or
    /// the client hung up, interactionNotAllowed at once when nobody can be asked). WireProtocol.md,
    /// Prompting for a front end.
    case promptUnlock
    /// PROMPT_READ: on a delegated connection only, COPY_MATCHING with any authentication the items'
    /// access controls need answered by the agent's own prompter (the configured pinentry naming the
    /// delegated app, the biometric sensor) instead of AUTH_NEEDED to the client; ITEMS, else the
    /// ERROR (userCanceled when the person cancelled or the client hung up, interactionNotAllowed at
    /// once when nobody can be asked). WireProtocol.md, Prompting for a front end.
    case promptRead(ItemQuery)
    /// PORTAL_SECRET: the desktop portal's per-app secret of Flatpak app `appID` (a valid Flatpak
    /// application id), created by the agent on first use; only for a caller whose manifest grants
    /// `portal-secret` (WireProtocol.md, Portal secrets).
    case portalSecret(appID: String)
    /// SYNC_SETUP (issue #29): `coffer sync init` or `join` with the remote's URL and this device's
    /// name (WireProtocol.md, Sync).
    case syncSetup(SyncSetupOperation, remote: String, name: String)
    /// SYNC_CIRCLE: approve a pairing code, remove a device (its id or name), or list the devices.
    case syncCircle(SyncCircleOperation, argument: String)
    /// SYNC_STATUS: the background sync's state; `now`: run a sync first and answer when it ended.
    case syncStatus(now: Bool)
    /// SYNC_CONFLICTS: the conflicts kept (the losing versions); `restore`: write back the loser of
    /// the conflict with this id (it becomes the newest version everywhere).
    case syncConflicts(restore: String?)
    /// FILES: protected directories (issue #45): protect one, the status, lock all.
    case files(FilesOperation)

    /// True if the encoded frame holds a passcode or secret (the sender wipes it after use).
    public var carriesSecret: Bool {
        switch self {
        case .unlock, .setPasscode, .add, .authorize: true
        case .authOptions(let o): o.passcode != nil || o.applicationPassword != nil
        case .passcodeSync(let p): p != nil
        case .removePasscode, .escrowUnlock, .escrowRevoke, .backupCreate, .backupRestore: true
        case .authResponse(let a): a.carriesSecret
        case .update(_, let c): c.secret != nil
        case .files(.drop), .files(.dropPart): true
        case .keyCreate(let k, _, _): k.key != nil
        default: false
        }
    }

    /// Encodes a complete frame (length prefix included).
    public func encodeFrame(requestID: UInt32) -> [UInt8] {
        switch self {
        case .hello(let minV, let maxV, let name):
            var f = FrameBuilder(type: .hello, requestID: requestID, payloadCapacity: 6 + name.utf8.count)
            f.w.u16(minV); f.w.u16(maxV); f.w.shortString(name)
            return f.finish()
        case .status: return FrameBuilder.empty(.status, requestID: requestID)
        case .protections: return FrameBuilder.empty(.protections, requestID: requestID)
        case .prompter: return FrameBuilder.empty(.prompter, requestID: requestID)
        case .counters: return FrameBuilder.empty(.counters, requestID: requestID)
        case .loginSession(let opened):
            var f = FrameBuilder(type: .session, requestID: requestID, payloadCapacity: 1)
            f.w.u8(opened ? 1 : 2)
            return f.finish()
        case .noteAccess(let access):
            var f = FrameBuilder(type: .noteAccess, requestID: requestID, payloadCapacity: 1)
            f.w.u8(access.rawValue)
            return f.finish()
        case .promptUnlock: return FrameBuilder.empty(.promptUnlock, requestID: requestID)
        case .lock: return FrameBuilder.empty(.lock, requestID: requestID)
        case .subscribe: return FrameBuilder.empty(.subscribe, requestID: requestID)
        case .subscribeTo(let topics):
            var f = FrameBuilder(type: .subscribeEvents, requestID: requestID, payloadCapacity: 1)
            f.w.u8(topics.rawValue)
            return f.finish()
        case .whoami: return FrameBuilder.empty(.whoami, requestID: requestID)
        case .delegate(let pid, let startTime):
            var f = FrameBuilder(type: .delegate, requestID: requestID, payloadCapacity: 12)
            f.w.u32(UInt32(bitPattern: pid)); f.w.u64(startTime)
            return f.finish()
        case .portalSecret(let appID):
            var f = FrameBuilder(type: .portalSecret, requestID: requestID, payloadCapacity: 2 + appID.utf8.count)
            f.w.shortString(appID)
            return f.finish()
        case .syncSetup(let op, let remote, let name):
            var f = FrameBuilder(type: .syncSetup, requestID: requestID, payloadCapacity: 5 + remote.utf8.count + name.utf8.count)
            f.w.u8(op.rawValue); f.w.shortString(remote); f.w.shortString(name)
            return f.finish()
        case .syncCircle(let op, let argument):
            var f = FrameBuilder(type: .syncCircle, requestID: requestID, payloadCapacity: 3 + argument.utf8.count)
            f.w.u8(op.rawValue); f.w.shortString(argument)
            return f.finish()
        case .syncStatus(let now):
            var f = FrameBuilder(type: .syncStatus, requestID: requestID, payloadCapacity: 1)
            f.w.u8(now ? 2 : 1)
            return f.finish()
        case .files(let op):
            var capacity = 4 + FilesOperation.maximumPathBytes
            if case .drop(_, let name, let data) = op { capacity += 6 + name.utf8.count + data.count }
            if case .dropPart(_, let name, _, let data) = op { capacity += 27 + name.utf8.count + data.count }
            var f = FrameBuilder(type: .files, requestID: requestID, payloadCapacity: capacity)
            switch op {
            case .protect(let path, let protection): f.w.u8(1); f.w.shortString(path); f.w.u8(protection.rawValue)
            case .status(let path): f.w.u8(2); f.w.shortString(path ?? "")
            case .lockAll: f.w.u8(3)
            case .drop(let path, let name, let data): f.w.u8(4); f.w.shortString(path); f.w.shortString(name); f.secret(data)
            case .dropPart(let path, let name, let part, let data):
                f.w.u8(5); f.w.shortString(path); f.w.shortString(name); f.w.raw(part.dropID); f.w.u32(part.index)
                f.w.u8(part.final ? 1 : 0); f.secret(data)
            }
            return f.finish()
        case .syncConflicts(let restore):
            var f = FrameBuilder(type: .syncConflicts, requestID: requestID, payloadCapacity: 3 + (restore?.utf8.count ?? 0))
            if let restore { f.w.u8(2); f.w.shortString(restore) } else { f.w.u8(1) }
            return f.finish()
        case .authOptions(let o):
            var f = FrameBuilder(type: .authOptions, requestID: requestID,
                                 payloadCapacity: 17 + o.operationPrompt.utf8.count + (o.passcode?.count ?? 0) + (o.applicationPassword?.count ?? 0))
            f.w.u8((o.noUserInterface ? 1 : 0) | (o.keepsForConnection ? 2 : 0)); f.w.shortString(o.operationPrompt); f.w.u32(o.reuseSeconds)
            if let p = o.passcode { f.w.u8(1); f.secret(p) } else { f.w.u8(0) }
            if let p = o.applicationPassword { f.w.u8(1); f.secret(p) } else { f.w.u8(0) }
            return f.finish()
        case .authResponse(let a):
            var size = 1
            if case .passcode(let p) = a { size += 4 + p.count }
            if case .applicationPassword(let p) = a { size += 4 + p.count }
            var f = FrameBuilder(type: .authResponse, requestID: requestID, payloadCapacity: size)
            switch a {
            case .cancel: f.w.u8(0)
            case .passcode(let p): f.w.u8(1); f.secret(p)
            case .waitForBiometry: f.w.u8(2)
            case .fallback: f.w.u8(3)
            case .applicationPassword(let p): f.w.u8(4); f.secret(p)
            }
            return f.finish()
        case .laCanEvaluate(let p):
            var f = FrameBuilder(type: .laCanEvaluate, requestID: requestID, payloadCapacity: 1)
            f.w.u8(p.rawValue)
            return f.finish()
        case .laEvaluate(let p, let reason):
            var f = FrameBuilder(type: .laEvaluate, requestID: requestID, payloadCapacity: 3 + reason.utf8.count)
            f.w.u8(p.rawValue); f.w.shortString(reason)
            return f.finish()
        case .bio(let op, let name):
            var f = FrameBuilder(type: .bio, requestID: requestID, payloadCapacity: 3 + name.utf8.count)
            f.w.u8(op.rawValue); f.w.shortString(name)
            return f.finish()
        case .removePasscode(let current):
            var f = FrameBuilder(type: .removePasscode, requestID: requestID, payloadCapacity: 4 + current.count)
            f.secret(current)
            return f.finish()
        case .backupCreate(let path, let password):
            var f = FrameBuilder(type: .backup, requestID: requestID, payloadCapacity: 7 + path.utf8.count + password.count)
            f.w.u8(1); f.w.shortString(path); f.secret(password)
            return f.finish()
        case .backupRestore(let path, let password, let dry):
            var f = FrameBuilder(type: .backup, requestID: requestID, payloadCapacity: 7 + path.utf8.count + password.count)
            f.w.u8(dry ? 3 : 2); f.w.shortString(path); f.secret(password)
            return f.finish()
        case .escrowCreate:
            var f = FrameBuilder(type: .escrow, requestID: requestID, payloadCapacity: 1)
            f.w.u8(1)
            return f.finish()
        case .escrowUnlock(let secret):
            var f = FrameBuilder(type: .escrow, requestID: requestID, payloadCapacity: 5 + secret.count)
            f.w.u8(2); f.secret(secret)
            return f.finish()
        case .escrowRevoke(let passcode):
            var f = FrameBuilder(type: .escrow, requestID: requestID, payloadCapacity: 5 + passcode.count)
            f.w.u8(3); f.secret(passcode)
            return f.finish()
        case .passcodeSync(let old):
            var f = FrameBuilder(type: .passcodeSync, requestID: requestID, payloadCapacity: 5 + (old?.count ?? 0))
            if let old { f.w.u8(1); f.secret(old) } else { f.w.u8(0) }
            return f.finish()
        case .authorize(let group, let p):
            var f = FrameBuilder(type: .authorize, requestID: requestID, payloadCapacity: 6 + group.utf8.count + p.count)
            f.w.shortString(group); f.secret(p)
            return f.finish()
        case .unlock(let p):
            var f = FrameBuilder(type: .unlock, requestID: requestID, payloadCapacity: 4 + p.count)
            f.secret(p)
            return f.finish()
        case .setPasscode(let current, let new):
            var f = FrameBuilder(type: .setPasscode, requestID: requestID, payloadCapacity: 8 + current.count + new.count)
            f.secret(current); f.secret(new)
            return f.finish()
        case .add(let item, let flags):
            let attrs = AttributeCodec.encode(item.attributes)
            var f = FrameBuilder(type: .add, requestID: requestID, payloadCapacity: 6 + attrs.count + item.secret.count)
            f.w.u8(ItemClassCode.encode(item.itemClass)); f.w.raw(attrs); f.secret(item.secret); f.w.u8(flags.rawValue)
            return f.finish()
        case .copyMatching(let q):
            let query = QueryCodec.encode(q)
            var f = FrameBuilder(type: .copyMatching, requestID: requestID, payloadCapacity: query.count)
            f.w.raw(query)
            return f.finish()
        case .update(let q, let c):
            let query = QueryCodec.encode(q, everyMatch: true), attrs = AttributeCodec.encode(c.attributes)
            var f = FrameBuilder(type: .update, requestID: requestID,
                                 payloadCapacity: query.count + attrs.count + 5 + (c.secret?.count ?? 0))
            f.w.raw(query); f.w.raw(attrs)
            if let s = c.secret { f.w.u8(1); f.secret(s) } else { f.w.u8(0) }
            return f.finish()
        case .delete(let q):
            let query = QueryCodec.encode(q, everyMatch: true)
            var f = FrameBuilder(type: .delete, requestID: requestID, payloadCapacity: query.count)
            f.w.raw(query)
            return f.finish()
        case .check(let op):
            var f = FrameBuilder(type: .check, requestID: requestID, payloadCapacity: 21)
            switch op {
            case .verify: f.w.u8(1); f.w.blob([])
            case .quarantine: f.w.u8(2); f.w.blob([])
            case .listQuarantine: f.w.u8(3); f.w.blob([])
            case .restore(let ref): f.w.u8(4); f.w.blob(ref)
            }
            return f.finish()
        case .checkPage(let op, let cursor):
            var f = FrameBuilder(type: .checkPage, requestID: requestID, payloadCapacity: 9)
            switch op {
            case .verify: f.w.u8(1)
            case .quarantine: f.w.u8(2)
            case .listQuarantine: f.w.u8(3)
            case .restore: f.w.u8(4)   // malformed: the agent answers -50 (restore is not paged)
            }
            f.w.u64(cursor)
            return f.finish()
        case .keyCreate(let k, let attributes, let flags):
            let attrs = AttributeCodec.encode(attributes)
            var f = FrameBuilder(type: .keyCreate, requestID: requestID, payloadCapacity: 6 + attrs.count + (k.key?.count ?? 0))
            f.w.u8(k.key == nil ? 1 : 2); f.w.raw(attrs); f.secret(k.key ?? SecureBytes(count: 0)); f.w.u8(flags.rawValue)
            return f.finish()
        case .promptRead(let q):
            let query = QueryCodec.encode(q)
            var f = FrameBuilder(type: .promptRead, requestID: requestID, payloadCapacity: query.count)
            f.w.raw(query)
            return f.finish()
        case .copyMatchingPage(let q, let cursor):
            let query = QueryCodec.encode(q)
            var f = FrameBuilder(type: .copyMatchingPage, requestID: requestID, payloadCapacity: query.count + 8)
            f.w.raw(query); f.w.u64(cursor)
            return f.finish()
        case .keySign(let q, let data, let flags):
            var one = q
            one.limit = .one
            one.returnData = false; one.returnAttributes = false; one.returnPersistentRef = false
            let query = QueryCodec.encode(one)
            var f = FrameBuilder(type: .keySign, requestID: requestID, payloadCapacity: query.count + 8 + data.count)
            f.w.raw(query); f.w.blob(data); f.w.u32(flags)
            return f.finish()
        }
    }

    /// Decodes a frame body (type, request id, payload). The request id is returned even for
    /// payload errors through ``WireFormat/requestID(ofBody:)``.
    public static func decodeBody(_ body: UnsafeRawBufferPointer) throws(ProtocolError) -> (UInt32, AgentRequest) {
        var r = BodyReader(body)
        let typeByte = try r.u8("message type")
        let id = try r.u32("request id")
        guard let type = MessageType(rawValue: typeByte) else {
            throw ProtocolError("unknown message type")
        }
        let request: AgentRequest
        switch type {
        case .hello:
            request = .hello(minVersion: try r.u16("minVersion"), maxVersion: try r.u16("maxVersion"), clientName: try r.sstr("client name"))
        case .status: request = .status
        case .protections: request = .protections
        case .prompter: request = .prompter
        case .counters: request = .counters
        case .session:
            switch try r.u8("session event") {
            case 1: request = .loginSession(opened: true)
            case 2: request = .loginSession(opened: false)
            default: throw ProtocolError("SESSION: the event is 1 (opened) or 2 (closed)")
            }
        case .noteAccess:
            guard let access = NotedAccess(rawValue: try r.u8("noted access")) else {
                throw ProtocolError("NOTE_ACCESS: the operation is 1 (add) to 5 (find)")
            }
            request = .noteAccess(access)
        case .promptUnlock: request = .promptUnlock
        case .lock: request = .lock
        case .subscribe: request = .subscribe
        case .subscribeEvents:
            let topics = EventTopics(rawValue: try r.u8("topics"))
            guard !topics.isEmpty, EventTopics.known.isSuperset(of: topics) else {
                throw ProtocolError("SUBSCRIBE_EVENTS: topics must be 1 to 7 (bit 0 lock events, bit 1 item changes, bit 2 their groups)")
            }
            request = .subscribeTo(topics)
        case .whoami: request = .whoami
        case .delegate:
            let pid = try r.u32("pid")
            guard pid > 0, pid <= UInt32(Int32.max) else { throw ProtocolError("DELEGATE: the pid must be from 1 to 2147483647") }
            request = .delegate(pid: Int32(pid), startTime: try r.u64("start time"))
        case .portalSecret:
            let app = try r.sstr("app id")
            guard FlatpakAppID.isValid(app) else { throw ProtocolError("PORTAL_SECRET: the app id is not a valid Flatpak application id") }
            request = .portalSecret(appID: app)
        case .syncSetup:
            guard let op = SyncSetupOperation(rawValue: try r.u8("operation")) else { throw ProtocolError("unknown SYNC_SETUP operation") }
            let remote = try r.sstr("remote"), name = try r.sstr("device name")
            guard SyncText.isRemote(remote) else { throw ProtocolError("SYNC_SETUP: the remote is 1 to 4096 bytes without control characters") }
            guard SyncText.isName(name) else { throw ProtocolError("SYNC_SETUP: the device name is 1 to 64 bytes without control characters") }
            request = .syncSetup(op, remote: remote, name: name)
        case .syncCircle:
            guard let op = SyncCircleOperation(rawValue: try r.u8("operation")) else { throw ProtocolError("unknown SYNC_CIRCLE operation") }
            let argument = try r.sstr("argument")
            let bare = op == .devices || op == .circle
            guard bare ? argument.isEmpty : SyncText.isName(argument) else {
                throw ProtocolError(bare ? "SYNC_CIRCLE devices and circle take no argument"
                                                   : "SYNC_CIRCLE: the code or device is 1 to 64 bytes without control characters")
            }
            request = .syncCircle(op, argument: argument)
        case .syncStatus:
            let op = try r.u8("operation")
            guard op == 1 || op == 2 else { throw ProtocolError("unknown SYNC_STATUS operation") }
            request = .syncStatus(now: op == 2)
        case .files:
            func path(_ r: inout BodyReader, empty: Bool) throws(ProtocolError) -> String {
                let p = try r.sstr("path")
                if empty && p.isEmpty { return p }
                guard FilesOperation.isValidPath(p) else {
                    throw ProtocolError("FILES: the path must be absolute, at most \(FilesOperation.maximumPathBytes) bytes, without NUL, empty, . or .. components")
                }
                return p
            }
            /// A drop's file name: 1 to 255 bytes without a slash or NUL, not . or ..
            func fileName(_ r: inout BodyReader, _ what: String) throws(ProtocolError) -> String {
                let name = try r.sstr("file name")
                let bytes = Array(name.utf8)
                guard !bytes.isEmpty, bytes.count <= 255, !bytes.contains(0), !bytes.contains(UInt8(ascii: "/")), name != ".", name != ".." else {
                    throw ProtocolError("\(what): the file name is 1 to 255 bytes without a slash or NUL, not . or ..")
                }
                return name
            }
            switch try r.u8("operation") {
            case 1:
                let p = try path(&r, empty: false)
                guard let c = FileProtection(rawValue: try r.u8("class")) else { throw ProtocolError("FILES: unknown protection class (1 to 4)") }
                request = .files(.protect(path: p, protection: c))
            case 2:
                let p = try path(&r, empty: true)
                request = .files(.status(path: p.isEmpty ? nil : p))
            case 3: request = .files(.lockAll)
            case 4:
                let p = try path(&r, empty: false)
                let name = try fileName(&r, "FILES drop")
                request = .files(.drop(path: p, name: name, data: try r.secret("file contents")))
            case 5:
                let p = try path(&r, empty: false)
                let name = try fileName(&r, "FILES drop part")
                let dropID = Array(try r.bytes(16, "drop id"))
                let index = try r.u32("part index")
                let final = try r.u8("final")
                guard final <= 1 else { throw ProtocolError("FILES drop part: final is 0 or 1") }
                request = .files(.dropPart(path: p, name: name, part: FileDropPart(dropID: dropID, index: index, final: final == 1),
                                           data: try r.secret("file contents")))
            default: throw ProtocolError("unknown FILES operation")
            }
        case .syncConflicts:
            switch try r.u8("operation") {
            case 1: request = .syncConflicts(restore: nil)
            case 2:
                let id = try r.sstr("conflict id")
                guard SyncText.isName(id) else { throw ProtocolError("SYNC_CONFLICTS: the conflict id is 1 to 64 bytes without control characters") }
                request = .syncConflicts(restore: id)
            default: throw ProtocolError("unknown SYNC_CONFLICTS operation")
            }
        case .authorize:
            let group = try r.sstr("access group")
            guard !group.isEmpty else { throw ProtocolError("empty access group") }
            request = .authorize(accessGroup: group, passcode: try r.secret("passcode"))
        case .authOptions:
            let flags = try r.u8("flags")
            guard flags <= 3 else { throw ProtocolError("unknown AUTH_OPTIONS flags") }
            let prompt = try r.sstr("operation prompt")
            guard prompt.utf8.count <= AuthenticationOptions.maximumPromptBytes else { throw ProtocolError("operation prompt too long") }
            let reuse = try r.u32("reuse seconds")
            guard reuse <= AuthenticationOptions.maximumReuseSeconds else { throw ProtocolError("reuse duration above 300 seconds") }
            guard flags & 2 == 0 || reuse == 0 else { throw ProtocolError("a reuse duration with the keep-for-the-connection flag") }
            let has = try r.u8("credential flag")
            guard has <= 1 else { throw ProtocolError("credential flag must be 0 or 1") }
            let passcode = has == 1 ? try r.secret("passcode") : nil
            let hasApp = try r.u8("application password flag")
            guard hasApp <= 1 else { throw ProtocolError("application password flag must be 0 or 1") }
            let app = hasApp == 1 ? try r.secret("application password") : nil
            request = .authOptions(AuthenticationOptions(noUserInterface: flags & 1 != 0, operationPrompt: prompt, passcode: passcode,
                                                         reuseSeconds: reuse, applicationPassword: app, keepsForConnection: flags & 2 != 0))
        case .authResponse:
            switch try r.u8("answer kind") {
            case 0: request = .authResponse(.cancel)
            case 1: request = .authResponse(.passcode(try r.secret("passcode")))
            case 2: request = .authResponse(.waitForBiometry)
            case 3: request = .authResponse(.fallback)
            case 4: request = .authResponse(.applicationPassword(try r.secret("application password")))
            default: throw ProtocolError("unknown answer kind")
            }
        case .laCanEvaluate:
            guard let p = LAPolicy(rawValue: try r.u8("policy")) else { throw ProtocolError("unknown policy") }
            request = .laCanEvaluate(p)
        case .removePasscode:
            request = .removePasscode(current: try r.secret("current passcode"))
        case .backup:
            let op = try r.u8("operation")
            guard (1...3).contains(op) else { throw ProtocolError("unknown BACKUP operation") }
            let path = try r.sstr("path")
            guard path.hasPrefix("/"), path.utf8.count <= 4096, !path.utf8.contains(0) else { throw ProtocolError("the backup path must be absolute") }
            let password = try r.secret("backup password")
            request = op == 1 ? .backupCreate(path: path, password: password) : .backupRestore(path: path, password: password, dryRun: op == 3)
        case .escrow:
            switch try r.u8("operation") {
            case 1: request = .escrowCreate
            case 2: request = .escrowUnlock(secret: try r.secret("escrow secret"))
            case 3: request = .escrowRevoke(passcode: try r.secret("passcode"))
            default: throw ProtocolError("unknown ESCROW operation")
            }
        case .passcodeSync:
            switch try r.u8("operation") {
            case 0: request = .passcodeSync(oldPasscode: nil)
            case 1: request = .passcodeSync(oldPasscode: try r.secret("old passcode"))
            default: throw ProtocolError("unknown PASSCODE_SYNC operation")
            }
        case .bio:
            guard let op = BioOperation(rawValue: try r.u8("operation")) else { throw ProtocolError("unknown BIO operation") }
            let name = try r.sstr("finger name")
            switch op {
            case .enroll, .remove, .present:
                guard !name.isEmpty, name.utf8.count <= 64, name.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
                    throw ProtocolError("a finger name is 1 to 64 printable ASCII characters without spaces")
                }
            case .presentUnknown, .status:
                guard name.isEmpty else { throw ProtocolError("this BIO operation takes no name") }
            }
            request = .bio(op, name: name)
        case .laEvaluate:
            guard let p = LAPolicy(rawValue: try r.u8("policy")) else { throw ProtocolError("unknown policy") }
            let reason = try r.sstr("reason")
            guard !reason.isEmpty else { throw ProtocolError("empty reason (LocalAuthentication requires one)") }
            guard reason.utf8.count <= AuthenticationOptions.maximumPromptBytes else { throw ProtocolError("reason too long") }
            request = .laEvaluate(p, reason: reason)
        case .unlock: request = .unlock(passcode: try r.secret("passcode"))
        case .setPasscode: request = .setPasscode(current: try r.secret("current passcode"), new: try r.secret("new passcode"))
        case .add:
            guard let cls = try ItemClassCode.decode(try r.u8("item class"), allowAny: false) else { throw ProtocolError("no item class") }
            let attrs = try r.attributes("attributes")
            let secret = try r.secret("secret")
            let flags = try QueryCodec.flags(try r.u8("return flags"))
            request = .add(NewItem(itemClass: cls, attributes: attrs, secret: secret), flags)
        case .copyMatching: request = .copyMatching(try QueryCodec.decode(&r, allowLocked: true))
        case .promptRead: request = .promptRead(try QueryCodec.decode(&r))
        case .update:
            let q = try QueryCodec.decode(&r)
            let attrs = try r.attributes("changes")
            let has = try r.u8("has secret")
            guard has <= 1 else { throw ProtocolError("has-secret must be 0 or 1") }
            try QueryCodec.checkActsOnEveryMatch(q, "UPDATE")
            request = .update(q, ItemChanges(attributes: attrs, secret: has == 1 ? try r.secret("secret") : nil))
        case .delete:
            let q = try QueryCodec.decode(&r)
            try QueryCodec.checkActsOnEveryMatch(q, "DELETE")
            request = .delete(q)
        case .copyMatchingPage:
            let q = try QueryCodec.decode(&r, allowSkipUnreadable: true, allowLocked: true)
            request = .copyMatchingPage(q, cursor: try r.u64("cursor"))
        case .check:
            let op = try r.u8("check operation")
            let ref = try r.blob(max: WireFormat.persistentRefBytes, "persistent reference")
            switch op {
            case 1 where ref.isEmpty: request = .check(.verify)
            case 2 where ref.isEmpty: request = .check(.quarantine)
            case 3 where ref.isEmpty: request = .check(.listQuarantine)
            case 4 where ref.count == WireFormat.persistentRefBytes: request = .check(.restore(persistentRef: ref))
            default: throw ProtocolError("bad CHECK (operations 1-3 take an empty reference, 4 one of 16 bytes; no other operation exists)")
            }
        case .checkPage:
            let op = try r.u8("check operation")
            let cursor = try r.u64("cursor")
            switch op {
            case 1: request = .checkPage(.verify, cursor: cursor)
            case 2: request = .checkPage(.quarantine, cursor: cursor)
            case 3: request = .checkPage(.listQuarantine, cursor: cursor)
            default: throw ProtocolError("bad CHECK_PAGE (operations 1-3 only; restore is CHECK 4)")
            }
        case .keyCreate:
            let op = try r.u8("operation")
            guard op == 1 || op == 2 else { throw ProtocolError("unknown KEY_CREATE operation (1 generate, 2 import)") }
            let attrs = try r.attributes("attributes")
            let key = try r.secret("key")
            guard (op == 1) == (key.count == 0) else { throw ProtocolError("KEY_CREATE: generate takes no key, import takes one") }
            let flags = try QueryCodec.flags(try r.u8("return flags"))
            guard !flags.contains(.data) else { throw ProtocolError("KEY_CREATE never returns the private key (return flag data)") }
            request = .keyCreate(op == 1 ? .generate : .importing(key), attributes: attrs, flags)
        case .keySign:
            let q = try QueryCodec.decode(&r)
            guard q.itemClass == nil || q.itemClass == .key else { throw ProtocolError("KEY_SIGN: the query's class must be keys or any") }
            guard q.limit == .one, !q.returnData, !q.returnAttributes, !q.returnPersistentRef else {
                throw ProtocolError("KEY_SIGN signs with one key: its query's match limit must be one (kind 0) and its return flags 0")
            }
            let data = try r.blob(max: WireFormat.maximumLargeBodyBytes, "data")
            let flags = try r.u32("signature flags")
            guard flags & ~UInt32(6) == 0 else { throw ProtocolError("KEY_SIGN: undefined signature flag bits (2 rsa-sha2-256, 4 rsa-sha2-512)") }
            request = .keySign(q, data: data, flags: flags)
        case .ok, .helloReply, .statusReply, .items, .count, .itemsPage, .whoamiReply, .authNeeded, .authFeedback, .authFeedbackKind, .laResult,
             .bioStatus, .escrowSecret, .backupSummary, .event, .error, .checkReport, .itemsPageSkipping, .checkReportPage, .protectionsReply, .portalSecretReply,
             .syncCode, .syncDevices, .syncStatusReply, .syncConflictsReply, .prompterReply, .filesReply, .countersReply, .keySignature:
            throw ProtocolError("the message type is a reply, not a request")
        }
        try r.expectEnd("message")
        return (id, request)
    }
}

/// What a KEY_CREATE makes: a new key, or an item of a key given in the ssh-agent wire form.
public enum KeyCreation: Sendable {
    case generate
    case importing(SecureBytes)

    /// The key given (nil: generate one).
    public var key: SecureBytes? {
        if case .importing(let k) = self { return k }
        return nil
    }
}

/// An agent → client message.
public enum AgentResponse: Sendable {
    /// OK.
    case ok
    /// HELLO_REPLY.
    case helloReply(version: UInt16, agentVersion: String)
    /// STATUS_REPLY.
    case status(StatusReply)
    /// PROTECTIONS_REPLY.
    case protections(ProtectionsReply)
    /// PROMPTER_REPLY.
    case prompter(PrompterReply)
    /// COUNTERS_REPLY.
    case counters(AgentCounters)
    /// ITEMS: results of ADD or COPY_MATCHING.
    case items([ItemResult])
    /// ITEMS_PAGE: one page of a COPY_MATCHING_PAGE search and the cursor of the next one (0: none).
    case itemsPage([ItemResult], nextCursor: UInt64)
    /// ITEMS_PAGE_SKIPPING: ITEMS_PAGE for a query with ``ReturnFlags/skipUnreadable``, and how many
    /// items failing authentication this page skipped.
    case itemsPageSkipping([ItemResult], nextCursor: UInt64, unreadable: UInt32)
    /// CHECK_REPORT.
    case checkReport(CheckReport)
    /// CHECK_REPORT_PAGE: a CHECK_REPORT with the cursor of the next page (0: none).
    case checkReportPage(CheckReport)
    /// COUNT: items updated or deleted.
    case count(UInt64)
    /// WHOAMI_REPLY.
    case whoami(WhoAmIReply)
    /// AUTH_NEEDED: not a final reply; the request with this id waits for an AUTH_RESPONSE.
    case authNeeded(AuthenticationRequest)
    /// AUTH_FEEDBACK: not a final reply; something to show the person ("no match, try again"). With a
    /// kind it is AUTH_FEEDBACK_KIND (protocol version 2: only to clients whose HELLO announced it).
    case authFeedback(String, kind: AuthFeedbackKind?)
    /// LA_RESULT.
    case laResult(LAResult)
    /// BIO_STATUS.
    case bioStatus(BioStatus)
    /// ESCROW_SECRET: a new escrow record's secret (shown once; the agent keeps it nowhere).
    case escrowSecret(SecureBytes)
    /// PORTAL_SECRET_REPLY: a Flatpak app's portal secret (64 bytes when the agent made it).
    case portalSecret(SecureBytes)
    /// KEY_SIGNATURE: KEY_SIGN's signature, as an SSH signature blob (string algorithm ‖ string signature).
    case signature([UInt8])
    /// SYNC_CODE: a device's name and pairing code (SYNC_SETUP, SYNC_CIRCLE approve).
    case syncCode(SyncCode)
    /// SYNC_DEVICES: the circle's devices.
    case syncDevices([SyncDeviceInfo])
    /// SYNC_STATUS_REPLY.
    case syncStatus(SyncStatus)
    /// SYNC_CONFLICTS_REPLY: the conflicts kept, newest first (as many as fit one frame).
    case syncConflicts([SyncConflictInfo])
    /// FILES_REPLY: protected directories and their state.
    case files([ProtectedDirectoryStatus])
    /// BACKUP_SUMMARY: items written (create: `added` only), or added / duplicates kept / skipped
    /// as another device's (restore).
    case backupSummary(added: UInt32, duplicates: UInt32, otherDevice: UInt32)
    /// EVENT (request id 0).
    case event(LockEvent)
    /// ERROR with an OSStatus and a message.
    case error(SecError)

    /// True if the encoded frame holds a secret (ITEMS with data).
    public var carriesSecret: Bool {
        switch self {
        case .escrowSecret, .portalSecret: return true
        case .items(let items), .itemsPage(let items, _), .itemsPageSkipping(let items, _, _): return items.contains { $0.data != nil }
        default: return false
        }
    }

    /// Encodes a complete frame (length prefix included).
    public func encodeFrame(requestID: UInt32) -> [UInt8] {
        switch self {
        case .ok: return FrameBuilder.empty(.ok, requestID: requestID)
        case .helloReply(let v, let agent):
            var f = FrameBuilder(type: .helloReply, requestID: requestID, payloadCapacity: 4 + agent.utf8.count)
            f.w.u16(v); f.w.shortString(agent)
            return f.finish()
        case .status(let s):
            var f = FrameBuilder(type: .statusReply, requestID: requestID, payloadCapacity: 26 + s.agentVersion.utf8.count)
            f.w.u8(s.lockState.rawValue); f.w.u8(s.passcodeSet ? 1 : 0); f.w.u64(s.itemCount); f.w.shortString(s.agentVersion)
            f.w.u64(s.lockedMemoryBytes); f.w.u32(s.idleLockSeconds)
            return f.finish()
        case .counters(let c):
            var f = FrameBuilder(type: .countersReply, requestID: requestID, payloadCapacity: 32)
            f.w.u64(c.connections); f.w.u64(c.requests); f.w.u64(c.identifications); f.w.u64(c.searches)
            return f.finish()
        case .prompter(let p):
            let program = p.program ?? ""
            var f = FrameBuilder(type: .prompterReply, requestID: requestID,
                                 payloadCapacity: 7 + program.utf8.count + p.reason.utf8.count + p.display.utf8.count)
            f.w.shortString(program); f.w.shortString(p.reason); f.w.u8(p.hasDisplay ? 1 : 0); f.w.shortString(p.display)
            return f.finish()
        case .protections(let p):
            var f = FrameBuilder(type: .protectionsReply, requestID: requestID, payloadCapacity: 3)
            f.w.u8(p.deviceKeyInTPM ? 1 : 0); f.w.u8(p.attemptsCountedByTPM ? (p.tpmLockoutAuthorizationEmpty ? 2 : 1) : 0)
            f.w.u8(p.rollbackDetection ? 1 : 0)
            return f.finish()
        case .items(let items):
            return Self.encodeItems(type: .items, requestID: requestID, items, nextCursor: nil)
        case .itemsPage(let items, let next):
            return Self.encodeItems(type: .itemsPage, requestID: requestID, items, nextCursor: next)
        case .itemsPageSkipping(let items, let next, let unreadable):
            return Self.encodeItems(type: .itemsPageSkipping, requestID: requestID, items, nextCursor: next, unreadable: unreadable)
        case .checkReport(let c):
            var f = FrameBuilder(type: .checkReport, requestID: requestID,
                                 payloadCapacity: 12 + c.findings.reduce(0) { $0 + 8 + $1.persistentRef.count + $1.detail.utf8.count })
            f.w.u32(c.checked); f.w.u32(c.skipped)
            Self.encodeFindings(c.findings, into: &f.w)
            return f.finish()
        case .checkReportPage(let c):
            var f = FrameBuilder(type: .checkReportPage, requestID: requestID,
                                 payloadCapacity: 20 + c.findings.reduce(0) { $0 + WireFormat.encodedSize(of: $1) })
            f.w.u32(c.checked); f.w.u32(c.skipped); f.w.u64(c.nextCursor)
            Self.encodeFindings(c.findings, into: &f.w)
            return f.finish()
        case .count(let n):
            var f = FrameBuilder(type: .count, requestID: requestID, payloadCapacity: 8)
            f.w.u64(n)
            return f.finish()
        case .whoami(let w):
            var f = FrameBuilder(type: .whoamiReply, requestID: requestID, payloadCapacity: 64 + w.executable.utf8.count)
            f.w.u8(w.kind.rawValue); f.w.shortString(w.appID); f.w.u32(w.pid); f.w.shortString(w.executable)
            f.w.shortString(w.note); f.w.u16(UInt16(clamping: w.accessGroups.count))
            for g in w.accessGroups.prefix(Int(UInt16.max)) { f.w.shortString(g) }
            f.w.u8(w.mayAuthorize ? 1 : 0)
            return f.finish()
        case .authNeeded(let a):
            var f = FrameBuilder(type: .authNeeded, requestID: requestID, payloadCapacity: 5 + a.app.utf8.count + a.prompt.utf8.count)
            f.w.u8(a.methods.rawValue); f.w.shortString(a.app); f.w.shortString(a.prompt)
            return f.finish()
        case .authFeedback(let text, nil):
            var f = FrameBuilder(type: .authFeedback, requestID: requestID, payloadCapacity: 2 + text.utf8.count)
            f.w.shortString(text)
            return f.finish()
        case .authFeedback(let text, let kind?):
            var f = FrameBuilder(type: .authFeedbackKind, requestID: requestID, payloadCapacity: 3 + text.utf8.count)
            f.w.u8(kind.rawValue); f.w.shortString(text)
            return f.finish()
        case .laResult(let l):
            var f = FrameBuilder(type: .laResult, requestID: requestID, payloadCapacity: 11 + l.domainState.count + l.message.utf8.count)
            f.w.u32(UInt32(bitPattern: l.error?.rawValue ?? 0)); f.w.u8(l.biometryType); f.w.blob(l.domainState); f.w.shortString(l.message)
            return f.finish()
        case .backupSummary(let a, let d, let o):
            var f = FrameBuilder(type: .backupSummary, requestID: requestID, payloadCapacity: 12)
            f.w.u32(a); f.w.u32(d); f.w.u32(o)
            return f.finish()
        case .escrowSecret(let secret):
            var f = FrameBuilder(type: .escrowSecret, requestID: requestID, payloadCapacity: 4 + secret.count)
            f.secret(secret)
            return f.finish()
        case .portalSecret(let secret):
            var f = FrameBuilder(type: .portalSecretReply, requestID: requestID, payloadCapacity: 4 + secret.count)
            f.secret(secret)
            return f.finish()
        case .signature(let blob):
            var f = FrameBuilder(type: .keySignature, requestID: requestID, payloadCapacity: 4 + blob.count)
            f.w.blob(blob)
            return f.finish()
        case .syncCode(let c):
            var f = FrameBuilder(type: .syncCode, requestID: requestID, payloadCapacity: 4 + c.name.utf8.count + c.code.utf8.count)
            f.w.shortString(c.name); f.w.shortString(c.code)
            return f.finish()
        case .syncDevices(let devices):
            var f = FrameBuilder(type: .syncDevices, requestID: requestID, payloadCapacity: 2 + devices.reduce(0) { $0 + WireFormat.encodedSize(of: $1) })
            f.w.u16(UInt16(clamping: devices.count))
            for d in devices.prefix(Int(UInt16.max)) {
                f.w.shortString(d.id); f.w.shortString(d.name); f.w.u8((d.member ? 1 : 0) | (d.thisDevice ? 2 : 0))
            }
            return f.finish()
        case .syncStatus(let s):
            var f = FrameBuilder(type: .syncStatusReply, requestID: requestID, payloadCapacity: 45 + s.lastError.utf8.count)
            f.w.u8(s.state.rawValue); f.w.u8(s.running ? 1 : 0); f.w.u64(s.lastSuccessMillis); f.w.u64(s.lastAttemptMillis)
            f.w.shortString(s.lastError); f.w.u32(s.intervalSeconds); f.w.u32(s.conflicts); f.w.u32(s.applied); f.w.u32(s.recorded)
            f.w.u8(s.phase.rawValue); f.w.u32(s.done); f.w.u32(s.total)
            return f.finish()
        case .files(let dirs):
            var f = FrameBuilder(type: .filesReply, requestID: requestID, payloadCapacity: 4 + dirs.reduce(0) { $0 + WireFormat.encodedSize(of: $1) })
            f.w.u32(UInt32(dirs.count))
            for d in dirs {
                f.w.shortString(d.path); f.w.u8(d.protection.rawValue); f.w.raw(d.keyIdentifier.count == 16 ? d.keyIdentifier : [UInt8](repeating: 0, count: 16))
                f.w.u8(d.keyState.rawValue); f.w.shortString(d.problem)
                let holders = d.holders.prefix(WireFormat.maximumFileHolders)
                f.w.u16(UInt16(holders.count))
                for h in holders { f.w.u32(UInt32(bitPattern: h.pid)); f.w.shortString(h.name) }
            }
            return f.finish()
        case .syncConflicts(let conflicts):
            var f = FrameBuilder(type: .syncConflictsReply, requestID: requestID,
                                 payloadCapacity: 4 + conflicts.reduce(0) { $0 + WireFormat.encodedSize(of: $1) })
            f.w.u32(UInt32(conflicts.count))
            for c in conflicts {
                f.w.shortString(c.id); f.w.shortString(c.itemClass); f.w.shortString(c.service); f.w.shortString(c.account)
                f.w.u64(c.winnerMillis); f.w.u64(c.loserMillis); f.w.shortString(c.loserDevice); f.w.u8(c.loserDeleted ? 1 : 0)
            }
            return f.finish()
        case .bioStatus(let b):
            var f = FrameBuilder(type: .bioStatus, requestID: requestID,
                                 payloadCapacity: 16 + b.authenticator.utf8.count + b.domainState.count + b.detail.utf8.count)
            f.w.shortString(b.authenticator); f.w.u8(b.available ? 1 : 0); f.w.u32(b.enrolledCount); f.w.u8(b.lockedOut ? 1 : 0)
            f.w.blob(b.domainState); f.w.shortString(b.detail)
            return f.finish()
        case .event(let e):
            let groups: [String]? = if case .itemsChanged(let g) = e { g } else { nil }
            var f = FrameBuilder(type: .event, requestID: 0, payloadCapacity: 5 + (groups ?? []).reduce(0) { $0 + 2 + $1.utf8.count })
            switch e {
            case .willLock(let ms): f.w.u8(1); f.w.u32(ms)
            case .locked: f.w.u8(2); f.w.u32(0)
            case .unlocked: f.w.u8(3); f.w.u32(0)
            case .itemsChanged(nil): f.w.u8(4); f.w.u32(0)
            case .itemsChanged(let groups?):
                f.w.u8(5); f.w.u32(UInt32(groups.count))
                for g in groups { f.w.shortString(g) }
            }
            return f.finish()
        case .error(let e):
            var f = FrameBuilder(type: .error, requestID: requestID, payloadCapacity: 6 + e.message.utf8.count)
            f.w.u32(UInt32(bitPattern: e.status.rawValue))
            f.w.shortString(String(e.message.utf8.prefix(4096)) ?? "")
            return f.finish()
        }
    }

    /// ITEMS (`nextCursor` nil) or ITEMS_PAGE: the exact size is reserved first, so the one buffer
    /// holding secrets never reallocates.
    private static func encodeItems(type: MessageType, requestID: UInt32, _ items: [ItemResult], nextCursor: UInt64?,
                                    unreadable: UInt32? = nil) -> [UInt8] {
        var size = 4 + (nextCursor == nil ? 0 : 8) + (unreadable == nil ? 0 : 4)
        for it in items {
            size += 2 + (it.data.map { 4 + $0.count } ?? 0) + (it.attributes.map(AttributeCodec.encodedSize) ?? 0) + (it.persistentRef.map { 4 + $0.count } ?? 0)
        }
        var f = FrameBuilder(type: type, requestID: requestID, payloadCapacity: size)
        if let unreadable { f.w.u32(unreadable) }
        if let nextCursor { f.w.u64(nextCursor) }
        f.w.u32(UInt32(items.count))
        for it in items {
            var present: UInt8 = 0
            if it.data != nil { present |= ReturnFlags.data.rawValue }
            if it.attributes != nil { present |= ReturnFlags.attributes.rawValue }
            if it.persistentRef != nil { present |= ReturnFlags.persistentRef.rawValue }
            if it.locked { present |= ReturnFlags.locked.rawValue }
            if it.needsAuthentication && it.attributes != nil { present |= ReturnFlags.needsAuthentication.rawValue }
            f.w.u8(ItemClassCode.encode(it.itemClass)); f.w.u8(present)
            if let d = it.data { f.secret(d) }
            if let a = it.attributes { AttributeCodec.encode(a, into: &f.w) }
            if let p = it.persistentRef { f.w.blob(p) }
        }
        return f.finish()
    }

    /// The findings of a CHECK_REPORT or CHECK_REPORT_PAGE: a count, then each finding.
    private static func encodeFindings(_ findings: [CheckFinding], into w: inout ByteWriter) {
        w.u32(UInt32(findings.count))
        for x in findings {
            w.blob(x.persistentRef); w.u8(x.reason.rawValue); w.u8(x.quarantined ? 1 : 0); w.shortString(x.detail)
        }
    }

    private static func decodeFindings(_ r: inout BodyReader) throws(ProtocolError) -> [CheckFinding] {
        let n = Int(try r.u32("finding count"))
        guard n <= r.remaining / 8 else { throw ProtocolError("finding count exceeds the frame") }
        var findings: [CheckFinding] = []
        for _ in 0..<n {
            let ref = try r.blob(max: 64, "persistent reference")
            guard let reason = CheckFinding.Reason(rawValue: try r.u8("reason")) else { throw ProtocolError("unknown check reason") }
            let q = try r.u8("quarantined flag")
            guard q <= 1 else { throw ProtocolError("quarantined flag must be 0 or 1") }
            findings.append(CheckFinding(persistentRef: ref, reason: reason, quarantined: q == 1, detail: try r.sstr("detail")))
        }
        return findings
    }

    /// The items of an ITEMS or ITEMS_PAGE payload.
    private static func decodeItems(_ r: inout BodyReader) throws(ProtocolError) -> [ItemResult] {
        let n = Int(try r.u32("item count"))
        guard n <= r.remaining / 2 else { throw ProtocolError("item count exceeds the frame") }
        var items: [ItemResult] = []
        items.reserveCapacity(n)
        for _ in 0..<n {
            guard let cls = try ItemClassCode.decode(try r.u8("item class"), allowAny: false) else { throw ProtocolError("no item class") }
            var presentByte = try r.u8("present flags")
            // A locked match (ITEMS of a query with the locked flag): its reference and nothing else.
            let locked = presentByte == ReturnFlags.locked.rawValue | ReturnFlags.persistentRef.rawValue
            if locked { presentByte = ReturnFlags.persistentRef.rawValue }
            // A match whose secret needs the person (a query with the access-state flag): only beside its attributes.
            let needs = presentByte & ReturnFlags.needsAuthentication.rawValue != 0
            if needs {
                guard presentByte & ReturnFlags.attributes.rawValue != 0 else {
                    throw ProtocolError("the needs-authentication flag (32) comes only with an item's attributes")
                }
                presentByte &= ~ReturnFlags.needsAuthentication.rawValue
            }
            let present = try QueryCodec.flags(presentByte)
            var item = ItemResult(itemClass: cls)
            item.locked = locked
            item.needsAuthentication = needs
            if present.contains(.data) { item.data = try r.secret("data") }
            if present.contains(.attributes) { item.attributes = try r.attributes("attributes") }
            if present.contains(.persistentRef) {
                let ref = try r.blob(max: WireFormat.persistentRefBytes, "persistent reference")
                guard ref.count == WireFormat.persistentRefBytes else { throw ProtocolError("persistent reference must be 16 bytes") }
                item.persistentRef = ref
            }
            items.append(item)
        }
        return items
    }

    /// Decodes a frame body sent by the agent.
    public static func decodeBody(_ body: UnsafeRawBufferPointer) throws(ProtocolError) -> (UInt32, AgentResponse) {
        var r = BodyReader(body)
        let typeByte = try r.u8("message type")
        let id = try r.u32("request id")
        guard let type = MessageType(rawValue: typeByte) else {
            throw ProtocolError("unknown message type")
        }
        let response: AgentResponse
        switch type {
        case .ok: response = .ok
        case .helloReply: response = .helloReply(version: try r.u16("version"), agentVersion: try r.sstr("agent version"))
        case .statusReply:
            let byte = try r.u8("lock state")
            guard let state = LockState(rawValue: byte) else { throw ProtocolError("unknown lock state") }
            let set = try r.u8("passcode flag")
            guard set <= 1 else { throw ProtocolError("passcode flag must be 0 or 1") }
            response = .status(StatusReply(lockState: state, passcodeSet: set == 1, itemCount: try r.u64("item count"),
                                           agentVersion: try r.sstr("agent version"),
                                           lockedMemoryBytes: try r.u64("locked memory"), idleLockSeconds: try r.u32("idle lock")))
        case .countersReply:
            response = .counters(AgentCounters(connections: try r.u64("connections"), requests: try r.u64("requests"),
                                               identifications: try r.u64("identifications"), searches: try r.u64("searches")))
        case .prompterReply:
            let program = try r.sstr("program")
            guard program.isEmpty || program.hasPrefix("/") else { throw ProtocolError("PROMPTER_REPLY: the program must be empty or an absolute path") }
            let reason = try r.sstr("reason")
            let hasDisplay = try r.u8("display known")
            guard hasDisplay <= 1 else { throw ProtocolError("PROMPTER_REPLY: display known must be 0 or 1") }
            response = .prompter(PrompterReply(program: program.isEmpty ? nil : program, reason: reason, hasDisplay: hasDisplay == 1,
                                               display: try r.sstr("display")))
        case .protectionsReply:
            let deviceKey = try r.u8("device key")
            guard deviceKey <= 1 else { throw ProtocolError("PROTECTIONS_REPLY: device key must be 0 or 1") }
            // 0 the file, 1 the TPM, 2 the TPM with an empty lockout authorization (anyone can reset its count).
            let attempts = try r.u8("attempt counting")
            guard attempts <= 2 else { throw ProtocolError("PROTECTIONS_REPLY: attempt counting must be 0, 1 or 2") }
            let rollback = try r.u8("rollback detection")
            guard rollback <= 1 else { throw ProtocolError("PROTECTIONS_REPLY: rollback detection must be 0 or 1") }
            response = .protections(ProtectionsReply(deviceKeyInTPM: deviceKey == 1, attemptsCountedByTPM: attempts >= 1,
                                                     tpmLockoutAuthorizationEmpty: attempts == 2, rollbackDetection: rollback == 1))
        case .items: response = .items(try decodeItems(&r))
        case .itemsPage:
            let next = try r.u64("next cursor")
            let items = try decodeItems(&r)
            guard next == 0 || !items.isEmpty else { throw ProtocolError("a page with a next cursor must hold an item") }
            response = .itemsPage(items, nextCursor: next)
        case .itemsPageSkipping:
            let unreadable = try r.u32("unreadable count")
            let next = try r.u64("next cursor")
            let items = try decodeItems(&r)
            guard next == 0 || !items.isEmpty else { throw ProtocolError("a page with a next cursor must hold an item") }
            response = .itemsPageSkipping(items, nextCursor: next, unreadable: unreadable)
        case .checkReport:
            let checked = try r.u32("checked"), skipped = try r.u32("skipped")
            response = .checkReport(CheckReport(checked: checked, skipped: skipped, findings: try Self.decodeFindings(&r)))
        case .checkReportPage:
            let checked = try r.u32("checked"), skipped = try r.u32("skipped"), next = try r.u64("next cursor")
            let findings = try Self.decodeFindings(&r)
            guard next == 0 || !findings.isEmpty else { throw ProtocolError("a check page with a next cursor must hold a finding") }
            response = .checkReportPage(CheckReport(checked: checked, skipped: skipped, findings: findings, nextCursor: next))
        case .count: response = .count(try r.u64("count"))
        case .whoamiReply:
            let kindByte = try r.u8("identity kind")
            guard let kind = WhoAmIReply.Kind(rawValue: kindByte) else { throw ProtocolError("unknown identity kind") }
            let app = try r.sstr("app id"), pid = try r.u32("pid"), exe = try r.sstr("executable"), note = try r.sstr("note")
            let n = try r.u16("group count")
            var groups: [String] = []
            for _ in 0..<n { groups.append(try r.sstr("access group")) }
            let flag = try r.u8("authorize flag")
            guard flag <= 1 else { throw ProtocolError("authorize flag must be 0 or 1") }
            guard (kind == .unsigned) == app.isEmpty else { throw ProtocolError("an app id goes with a signed or Flatpak identity only") }
            response = .whoami(WhoAmIReply(kind: kind, appID: app, pid: pid, executable: exe, note: note, accessGroups: groups,
                                           mayAuthorize: flag == 1))
        case .authNeeded:
            let m = try r.u8("methods")
            let methods = AuthenticationMethods(rawValue: m)
            guard !methods.isEmpty, methods.rawValue & ~AuthenticationMethods.all.rawValue == 0 else { throw ProtocolError("bad methods") }
            response = .authNeeded(AuthenticationRequest(methods: methods, app: try r.sstr("app"), prompt: try r.sstr("prompt")))
        case .authFeedback:
            response = .authFeedback(try r.sstr("feedback"), kind: nil)
        case .authFeedbackKind:
            guard let kind = AuthFeedbackKind(rawValue: try r.u8("feedback kind")) else { throw ProtocolError("unknown feedback kind") }
            response = .authFeedback(try r.sstr("feedback"), kind: kind)
        case .laResult:
            let code = Int32(bitPattern: try r.u32("code"))
            var error: LAErrorCode? = nil
            if code != 0 {
                guard let e = LAErrorCode(rawValue: code) else { throw ProtocolError("unknown LocalAuthentication code") }
                error = e
            }
            let type = try r.u8("biometry type")
            guard type <= 1 else { throw ProtocolError("unknown biometry type") }
            let ds = try r.blob(max: AccessControl.maximumDomainStateBytes, "domain state")
            response = .laResult(LAResult(error: error, biometryType: type, domainState: ds, message: try r.sstr("message")))
        case .escrowSecret:
            response = .escrowSecret(try r.secret("escrow secret"))
        case .portalSecretReply:
            response = .portalSecret(try r.secret("portal secret"))
        case .keySignature:
            let blob = try r.blob(max: WireFormat.maximumSignatureBytes, "signature")
            guard !blob.isEmpty else { throw ProtocolError("KEY_SIGNATURE: an empty signature") }
            response = .signature(blob)
        case .syncCode:
            response = .syncCode(SyncCode(name: try r.sstr("device name"), code: try r.sstr("pairing code")))
        case .syncDevices:
            let n = try r.u16("device count")
            var devices: [SyncDeviceInfo] = []
            for _ in 0..<n {
                let id = try r.sstr("device id"), name = try r.sstr("device name"), flags = try r.u8("device flags")
                guard flags <= 3 else { throw ProtocolError("SYNC_DEVICES: unknown device flags") }
                devices.append(SyncDeviceInfo(id: id, name: name, member: flags & 1 != 0, thisDevice: flags & 2 != 0))
            }
            response = .syncDevices(devices)
        case .syncStatusReply:
            guard let state = SyncStatus.State(rawValue: try r.u8("sync state")) else { throw ProtocolError("SYNC_STATUS_REPLY: unknown state") }
            let running = try r.u8("running")
            guard running <= 1 else { throw ProtocolError("SYNC_STATUS_REPLY: running must be 0 or 1") }
            var s = SyncStatus(state: state, running: running == 1, lastSuccessMillis: try r.u64("last success"),
                               lastAttemptMillis: try r.u64("last attempt"), lastError: try r.sstr("last error"),
                               intervalSeconds: try r.u32("interval"), conflicts: try r.u32("conflicts"),
                               applied: try r.u32("applied"), recorded: try r.u32("recorded"))
            guard let phase = SyncStatus.Phase(rawValue: try r.u8("sync phase")) else { throw ProtocolError("SYNC_STATUS_REPLY: unknown phase") }
            s.phase = phase
            s.done = try r.u32("done")
            s.total = try r.u32("total")
            guard s.running || phase == .idle else { throw ProtocolError("SYNC_STATUS_REPLY: a phase without a running sync") }
            guard s.done <= s.total else { throw ProtocolError("SYNC_STATUS_REPLY: done above total") }
            response = .syncStatus(s)
        case .filesReply:
            let n = try r.u32("directory count")
            var dirs: [ProtectedDirectoryStatus] = []
            for _ in 0..<n {
                let path = try r.sstr("path")
                guard FilesOperation.isValidPath(path) else { throw ProtocolError("FILES_REPLY: a path that is not absolute and normal") }
                guard let c = FileProtection(rawValue: try r.u8("class")) else { throw ProtocolError("FILES_REPLY: unknown protection class") }
                let id = Array(try r.bytes(16, "key identifier"))
                guard let state = FileKeyState(rawValue: try r.u8("key state")) else { throw ProtocolError("FILES_REPLY: unknown key state") }
                let problem = try r.sstr("problem")
                let count = Int(try r.u16("holder count"))
                guard count <= WireFormat.maximumFileHolders else { throw ProtocolError("FILES_REPLY: more than \(WireFormat.maximumFileHolders) holders") }
                var holders: [FileHolder] = []
                for _ in 0..<count { holders.append(FileHolder(pid: Int32(bitPattern: try r.u32("pid")), name: try r.sstr("process name"))) }
                dirs.append(ProtectedDirectoryStatus(path: path, protection: c, keyIdentifier: id, keyState: state, holders: holders, problem: problem))
            }
            response = .files(dirs)
        case .syncConflictsReply:
            let n = try r.u32("conflict count")
            var conflicts: [SyncConflictInfo] = []
            for _ in 0..<n {
                let id = try r.sstr("conflict id")
                let cls = try r.sstr("item class"), service = try r.sstr("service"), account = try r.sstr("account")
                let winner = try r.u64("winner time"), loser = try r.u64("loser time"), device = try r.sstr("loser device")
                let deleted = try r.u8("loser deleted")
                guard deleted <= 1 else { throw ProtocolError("SYNC_CONFLICTS_REPLY: deleted must be 0 or 1") }
                conflicts.append(SyncConflictInfo(id: id, itemClass: cls, service: service, account: account, winnerMillis: winner,
                                                  loserMillis: loser, loserDevice: device, loserDeleted: deleted == 1))
            }
            response = .syncConflicts(conflicts)
        case .backupSummary:
            response = .backupSummary(added: try r.u32("added"), duplicates: try r.u32("duplicates"), otherDevice: try r.u32("other device"))
        case .bioStatus:
            let name = try r.sstr("authenticator")
            let available = try r.u8("available")
            let count = try r.u32("enrolled count")
            let locked = try r.u8("locked out")
            guard available <= 1, locked <= 1 else { throw ProtocolError("BIO_STATUS flags must be 0 or 1") }
            let ds = try r.blob(max: AccessControl.maximumDomainStateBytes, "domain state")
            response = .bioStatus(BioStatus(authenticator: name, available: available == 1, enrolledCount: count, lockedOut: locked == 1,
                                            domainState: ds, detail: try r.sstr("detail")))
        case .event:
            let kind = try r.u8("event kind")
            let ms = try r.u32("grace")
            switch kind {
            case 1: response = .event(.willLock(graceMillis: ms))
            case 2: response = .event(.locked)
            case 3: response = .event(.unlocked)
            case 4:
                guard ms == 0 else { throw ProtocolError("EVENT itemsChanged carries 0") }
                response = .event(.itemsChanged(groups: nil))
            case 5:
                // The groups that changed: 1 to maxNamedGroups non-empty names, strictly ascending.
                guard ms >= 1, ms <= LockEvent.maxNamedGroups else { throw ProtocolError("EVENT itemsChanged names 1 to \(LockEvent.maxNamedGroups) groups") }
                var groups: [String] = []
                for _ in 0..<ms {
                    let g = try r.sstr("access group")
                    guard !g.isEmpty else { throw ProtocolError("EVENT itemsChanged: an empty access group") }
                    if let last = groups.last, !last.precedesInUTF8(g) {
                        throw ProtocolError("EVENT itemsChanged: access groups must be strictly ascending")
                    }
                    groups.append(g)
                }
                response = .event(.itemsChanged(groups: groups))
            default: throw ProtocolError("unknown event kind")
            }
        case .error:
            let code = Int32(bitPattern: try r.u32("status"))
            let message = try r.sstr("message")
            guard code != 0 else { throw ProtocolError("ERROR with status 0") }
            if let s = SecStatus(rawValue: code) {
                response = .error(SecError(s, message))
            } else {
                response = .error(SecError(.internalComponent, "agent error \(code): \(message)"))
            }
        default:
            throw ProtocolError("the message type is a request, not a reply")
        }
        try r.expectEnd("message")
        return (id, response)
    }
}

/// The query encoding shared by COPY_MATCHING, UPDATE and DELETE.
enum QueryCodec {
    static func flags(_ b: UInt8) throws(ProtocolError) -> ReturnFlags {
        let f = ReturnFlags(rawValue: b)
        guard ReturnFlags.all.isSuperset(of: f) else { throw ProtocolError("undefined flag bits set") }
        return f
    }

    /// Encodes a query. `everyMatch` (UPDATE, DELETE): `.one`, the default of ``ItemQuery/limit``,
    /// stands for "no limit given" and is sent as limit all, the only limit those requests accept,
    /// and the return flags are not sent (those requests return a count: a Swift caller may reuse
    /// the query of a lookup); `.count(n)` is sent as given, so the agent refuses it (errSecParam).
    static func encode(_ q: ItemQuery, everyMatch: Bool = false) -> [UInt8] {
        var w = ByteWriter(capacity: 64)
        w.u8(ItemClassCode.encode(q.itemClass))
        AttributeCodec.encode(q.attributes, into: &w)
        switch q.limit {
        case .one where everyMatch: w.u8(1); w.u32(0)
        case .one: w.u8(0); w.u32(0)
        case .all: w.u8(1); w.u32(0)
        case .count(let n): w.u8(2); w.u32(UInt32(clamping: n))
        }
        var flags: ReturnFlags = []
        if q.skipUnreadable && !everyMatch { flags.insert(.skipUnreadable) }
        if q.listsLockedItems && !everyMatch { flags.insert(.locked) }
        // Told beside attributes only (a query that asks for none sends no access-state flag).
        if q.reportsAccessState && q.returnAttributes && !everyMatch { flags.insert(.needsAuthentication) }
        if q.returnData && !everyMatch { flags.insert(.data) }
        if q.returnAttributes && !everyMatch { flags.insert(.attributes) }
        if q.returnPersistentRef && !everyMatch { flags.insert(.persistentRef) }
        w.u8(flags.rawValue)
        w.blob(q.persistentRef ?? [])
        return w.bytes
    }

    /// UPDATE and DELETE act on every match (as SecItemUpdate and SecItemDelete do): their query
    /// MUST have limit kind 1 (all) and no return flags; anything else is refused, never ignored.
    static func checkActsOnEveryMatch(_ q: ItemQuery, _ request: String) throws(ProtocolError) {
        guard q.limit == .all else {
            throw ProtocolError("\(request) acts on every match: its query's match limit must be all (kind 1)")
        }
        guard !q.returnData, !q.returnAttributes, !q.returnPersistentRef else {
            throw ProtocolError("\(request) returns a count, not items: its query's return flags must be 0")
        }
    }

    static func decode(_ r: inout BodyReader, allowSkipUnreadable: Bool = false, allowLocked: Bool = false) throws(ProtocolError) -> ItemQuery {
        let cls = try ItemClassCode.decode(try r.u8("item class"), allowAny: true)
        let attrs = try r.attributes("query attributes")
        let kind = try r.u8("limit kind")
        let count = try r.u32("limit count")
        let limit: MatchLimit
        switch kind {
        case 0 where count == 0: limit = .one
        case 1 where count == 0: limit = .all
        case 2 where count >= 1: limit = .count(Int(count))
        default: throw ProtocolError("bad match limit (kind 0 and 1 take count 0, kind 2 a count of at least 1, no other kind exists)")
        }
        var flagByte = try r.u8("return flags")
        let skip = allowSkipUnreadable && flagByte & ReturnFlags.skipUnreadable.rawValue != 0
        if skip { flagByte &= ~ReturnFlags.skipUnreadable.rawValue }
        let locked = allowLocked && flagByte & ReturnFlags.locked.rawValue != 0
        if locked { flagByte &= ~ReturnFlags.locked.rawValue }
        // The access-state flag: where locked matches may be named (the searches), and with attributes.
        let accessState = allowLocked && flagByte & ReturnFlags.needsAuthentication.rawValue != 0
        if accessState {
            guard flagByte & ReturnFlags.attributes.rawValue != 0 else {
                throw ProtocolError("the access-state flag (32) needs the attributes flag (2): it is told beside them")
            }
            flagByte &= ~ReturnFlags.needsAuthentication.rawValue
        }
        let flags = try flags(flagByte)
        // One reference, or several one after the other (any of these items), each named once.
        let ref = try r.blob(max: WireFormat.persistentRefBytes * ItemQuery.maximumPersistentRefs, "persistent reference")
        guard ref.count % WireFormat.persistentRefBytes == 0 else {
            throw ProtocolError("persistent reference must be 0 bytes or a multiple of 16 (one or more references)")
        }
        if ref.count > WireFormat.persistentRefBytes {
            var seen = Set<ArraySlice<UInt8>>()
            for start in stride(from: 0, to: ref.count, by: WireFormat.persistentRefBytes)
            where !seen.insert(ref[start..<start + WireFormat.persistentRefBytes]).inserted {
                throw ProtocolError("a persistent reference is named twice")
            }
        }
        var q = ItemQuery(itemClass: cls, attributes: attrs, limit: limit, returnData: flags.contains(.data),
                          returnAttributes: flags.contains(.attributes), returnPersistentRef: flags.contains(.persistentRef),
                          persistentRef: ref.isEmpty ? nil : ref)
        q.skipUnreadable = skip
        q.listsLockedItems = locked
        q.reportsAccessState = accessState
        return q
    }
}
