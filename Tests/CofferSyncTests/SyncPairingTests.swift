import CofferCrypto
import CofferModel
@testable import CofferSync
import CofferTestSupport
import Foundation
import Testing

/// Pairing (SyncFormat.md, "Pairing", issue #41 F3) against someone who can write the remote: every
/// machine clones one bare repository with the real `git`, and the attacker is one more clone that
/// writes whatever it likes there. Nothing read from the remote may decide who is in the circle: the
/// code, typed by the person and never written anywhere, does.
@Suite(.serialized) struct SyncPairingTests {
    let tmp = TemporaryDirectory("coffer-pair")

    /// A founded circle on a fresh remote, and a machine `name` that asked to join it (its request
    /// pushed): the founder, the joiner and the joiner's code.
    func founderAndJoiner(_ remote: String) throws -> (a: Machine, b: Machine, code: String) {
        let ga = try GitTransport.clone(remote: remote, into: tmp.file("a"))
        let a = Machine(replica: try SyncReplica.found(directory: ga.directory, keys: .generate(), name: "laptop", now: 1_000), git: ga)
        try a.push()
        let (b, code) = try joiner("b", remote)
        return (a, b, code)
    }

    func joiner(_ name: String, _ remote: String) throws -> (Machine, String) {
        let g = try GitTransport.clone(remote: remote, into: tmp.file(name))
        let head = try g.pull(lastSeen: "")
        let j = try SyncReplica.requestJoin(directory: g.directory, keys: .generate(), name: name, now: 1_000)
        var s = j.replica.state
        s.remoteHead = head
        j.replica.commit(s)
        let m = Machine(replica: j.replica, git: g)
        try m.push()
        return (m, j.code)
    }

    /// The attacker: a clone of the remote with keys of its own, and raw writes.
    final class Attacker {
        let git: GitTransport
        let keys: SyncDeviceKeys
        var head = ""
        init(_ git: GitTransport, keys: SyncDeviceKeys = .generate()) throws {
            self.git = git
            self.keys = keys
            head = try git.pull(lastSeen: "")
        }
        func fetch() throws { head = try git.pull(lastSeen: head) }
        func write(_ relative: String, _ bytes: [UInt8]) throws {
            let path = git.directory + "/" + relative
            try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
            try Data(bytes).write(to: URL(fileURLWithPath: path))
        }
        func read(_ relative: String) -> [UInt8]? { FileManager.default.contents(atPath: git.directory + "/" + relative).map { Array($0) } }
        func push() throws { head = try git.push(lastSeen: head, message: "attacker") }
        /// Its own circle's first epoch and device file, written to the remote.
        @discardableResult
        func foundOwnCircle() throws -> CircleEpoch {
            let device = SyncDevice(keys: keys, name: "laptop", createdMillis: 1_000)
            try write(device.path, device.encoded(signedWith: keys))
            let first = try SyncCircle.found(by: keys, device: device)
            try write(first.path, first.encoded)
            return first
        }
    }

    @Test func theCodeAdmitsTheJoinerAndBothShowOneCircleFingerprint() throws {
        let remote = try makeBareRemote(tmp)
        let (a, b, code) = try founderAndJoiner(remote)
        #expect(SyncPairingCode.parse(code)?.text == code && code.count == 14)
        #expect(try !b.replica.isMember(), "a joiner trusts nothing before its pairing proved a circle")
        let device = try pair(b, code: code, approver: a)
        #expect(device.name == "b" && device.id == b.replica.keys.id)
        #expect(try b.replica.circle().fingerprint == a.replica.circle().fingerprint)
        // The pairing's files are gone once it ended, the code with them.
        try a.fetch()
        let pairingDir = a.replica.directory + "/" + SyncPairingCode.parse(code)!.directory
        #expect((try? FileManager.default.contentsOfDirectory(atPath: pairingDir))?.isEmpty ?? true)
        try a.write("k", "v", now: 2_000)
        try a.push()
        _ = try b.pull()
        #expect(b.items["k"] == "v")
    }

    /// F3, attack 1: someone who can write the remote founds a circle of their own and answers the
    /// joiner's request before the member does, guessing the code (the request does not reveal it).
    /// The joiner refuses the answer, pins nothing and follows nothing of that circle; the attacker's
    /// later epoch "admitting" it changes nothing.
    @Test func aRemoteWriterWhoAnswersWithAGuessCapturesNothing() throws {
        let remote = try makeBareRemote(tmp)
        let (_, b, code) = try founderAndJoiner(remote)
        let m = try Attacker(try GitTransport.clone(remote: remote, into: tmp.file("m")))
        let own = try m.foundOwnCircle()
        let request = try SyncPairing.Request.decode(try #require(m.read(SyncPairingCode.parse(code)!.directory + "/request")))
        // The attacker answers with every part right but the code (the locator is public).
        let guess = try #require(SyncPairingCode.parse(String(code.prefix(5)) + "AAAA-AAAA"))
        let circle = SyncCircle(epochs: [own], devices: [m.keys.id: SyncDevice(keys: m.keys, name: "laptop", createdMillis: 1_000)])
        let (response, _) = try SyncPairing.respond(to: request, code: guess, approver: m.keys.id, circle: circle)
        try m.write(guess.directory + "/response", response.encoded)
        // And already "admits" the joiner into its circle.
        let admitted = try circle.next(signedBy: m.keys, adding: [request.device])
        try m.write(admitted.path, admitted.encoded)
        try m.push()
        try b.fetch()
        guard case .failed(let why) = try b.replica.advancePairing() else { Issue.record("the joiner took the attacker's answer"); return }
        #expect(why.contains("does not prove the code"), "\(why)")
        #expect(try !b.replica.isMember())
        #expect(b.replica.state.pinnedFirst.isEmpty && b.replica.state.pinned == nil, "nothing pinned")
        #expect(throws: SyncError.self) { _ = try b.replica.pull() }
        // Its refusal is on the remote, so a member that answered would stop waiting.
        try b.push()
        try m.fetch()
        let refusal = try SyncPairing.Confirm.decode(try #require(m.read(guess.directory + "/confirm")))
        #expect(refusal.tag == nil && refusal.sid == request.sid)
    }

    /// F3, attack 2: with push access only, a second first epoch whose signer id sorts before the real
    /// founder's, pushed while the person approves on the founder. Before, the joiner followed sort
    /// order into the attacker's circle and the founder refused every sync; now both follow the circle
    /// the pairing proved and the forged epoch is listed as refused.
    @Test func aCompetingFirstEpochCapturesNobodyAndStopsNobody() throws {
        let remote = try makeBareRemote(tmp)
        let (a, b, code) = try founderAndJoiner(remote)
        var keys = SyncDeviceKeys.generate()
        while !(keys.id < a.replica.keys.id) { keys = .generate() }
        let m = try Attacker(try GitTransport.clone(remote: remote, into: tmp.file("m")), keys: keys)
        let forged = try m.foundOwnCircle()
        try m.push()
        try pair(b, code: code, approver: a)
        #expect(try b.replica.circle().epochs[0].hash == a.replica.circle().epochs[0].hash)
        #expect(try b.replica.circle().epochs[0].hash != forged.hash)
        // Items flow both ways; nobody reads or writes the forged circle.
        try a.write("from-a", "1", now: 2_000)
        try a.push()
        _ = try b.pull()
        try b.write("from-b", "2", now: 2_001)
        try b.push()
        _ = try a.pull()
        #expect(b.items["from-a"] == "1" && a.items["from-b"] == "2")
        let files: [String: [UInt8]] = [forged.path: forged.encoded, try a.replica.circle().epochs[0].path: try a.replica.circle().epochs[0].encoded]
        let devices = try a.replica.circle().devices.merging([m.keys.id: SyncDevice(keys: m.keys, name: "laptop", createdMillis: 1_000)]) { x, _ in x }
        let resolved = try SyncCircle.resolve(epochFiles: files, devices: devices, pinned: nil, first: a.replica.state.pinnedFirst)
        #expect(resolved.rejected == [forged.path] && resolved.circle.epochs[0].signer == a.replica.keys.id)
    }

    /// A wrong code typed on the member: the joiner refuses the answer, the member's admission fails
    /// with the joiner's refusal, and nobody is admitted.
    @Test func aWrongCodeAdmitsNobodyOnEitherSide() throws {
        let remote = try makeBareRemote(tmp)
        let (a, b, code) = try founderAndJoiner(remote)
        let typo = String(code.prefix(5)) + (code.suffix(9).first == "A" ? "B" : "A") + String(code.suffix(8))
        try a.fetch()
        let approval = try a.replica.answer(code: typo)
        try a.push()
        try b.fetch()
        guard case .failed = try b.replica.advancePairing() else { Issue.record("the joiner took an answer to another code"); return }
        try b.push()
        try a.fetch()
        #expect(throws: SyncError.self) { _ = try a.replica.admit(approval) }
        #expect(try a.replica.circle().current.members.count == 1)
        // The code is spent on both sides: the member will not answer it again.
        #expect(throws: SyncError.self) { _ = try a.replica.answer(code: code) }
    }

    /// A response from an earlier pairing, copied by the attacker into a new pairing's directory, is
    /// refused by the joiner (another session), and the code is then spent.
    @Test func aReplayedPairingMessageIsRefused() throws {
        let remote = try makeBareRemote(tmp)
        let (a, b, codeB) = try founderAndJoiner(remote)
        let m = try Attacker(try GitTransport.clone(remote: remote, into: tmp.file("m")))
        // The earlier pairing's response, as the attacker saw it on the remote.
        try a.fetch()
        let approval = try a.replica.answer(code: codeB)
        try a.push()
        try m.fetch()
        let old = try #require(m.read(SyncPairingCode.parse(codeB)!.directory + "/response"))
        a.replica.abandon(approval)
        try a.push()
        let (c, codeC) = try joiner("c", remote)
        try m.fetch()
        try m.write(SyncPairingCode.parse(codeC)!.directory + "/response", old)
        try m.push()
        try c.fetch()
        guard case .failed(let why) = try c.replica.advancePairing() else { Issue.record("a replayed response was taken"); return }
        #expect(why.contains("another pairing"), "\(why)")
        #expect(try !c.replica.isMember() && b.replica.state.joining?.stage == .requested)
    }

    /// After a successful pairing the code is spent: typing it again answers nothing, and a copy of
    /// the old request the attacker puts back is refused as already answered.
    @Test func aCodeIsNeverUsedTwice() throws {
        let remote = try makeBareRemote(tmp)
        let (a, b, code) = try founderAndJoiner(remote)
        let m = try Attacker(try GitTransport.clone(remote: remote, into: tmp.file("m")))
        let dir = SyncPairingCode.parse(code)!.directory
        let request = try #require(m.read(dir + "/request"))
        try pair(b, code: code, approver: a)
        try a.fetch()
        #expect(throws: SyncError.self) { _ = try a.replica.answer(code: code) }
        try m.fetch()
        try m.write(dir + "/request", request)
        try m.push()
        try a.fetch()
        do {
            _ = try a.replica.answer(code: code)
            Issue.record("a used code was answered again")
        } catch {
            #expect(error.message.contains("already"), "\(error)")
        }
    }

    /// The attacker replaces the joiner's request with one of its own device (it knows no code): the
    /// member answers it (one guess spent), the attacker cannot confirm, and nobody is admitted.
    @Test func aRequestReplacedByTheAttackerAdmitsNobody() throws {
        let remote = try makeBareRemote(tmp)
        let (a, _, code) = try founderAndJoiner(remote)
        let m = try Attacker(try GitTransport.clone(remote: remote, into: tmp.file("m")))
        let parsed = try #require(SyncPairingCode.parse(code))
        let device = SyncDevice(keys: m.keys, name: "b", createdMillis: 1_000)
        let guess = try #require(SyncPairingCode.parse(String(code.prefix(5)) + "ZZZZ-ZZZZ"))
        let (joining, request) = try SyncPairing.start(code: guess, deviceFile: device.encoded(signedWith: m.keys))
        try m.write(device.path, device.encoded(signedWith: m.keys))
        try m.write(parsed.directory + "/request", request.encoded)
        try m.push()
        try a.fetch()
        let approval = try a.replica.answer(code: code)
        try a.push()
        // The attacker answers the member's response as well as it can: with its guess's key.
        try m.fetch()
        let response = try SyncPairing.Response.decode(try #require(m.read(parsed.directory + "/response")))
        #expect(throws: SyncError.self) { _ = try SyncPairing.verify(response, joining: joining) }
        let fakeTag = [UInt8](repeating: 0x55, count: CPace.tagBytes)
        try m.write(parsed.directory + "/confirm", try SyncPairing.Confirm.make(sid: request.sid, tag: fakeTag).encoded)
        try m.push()
        try a.fetch()
        #expect(throws: SyncError.self) { _ = try a.replica.admit(approval) }
        #expect(try !a.replica.circle().current.isMember(m.keys.id))
    }

    /// A member whose state format 2 wrote (before pairing pinned the first epoch) keeps syncing after
    /// the upgrade: the chain back from its pinned epoch proves its circle, whose first epoch it pins
    /// from then on, so a competing first epoch pushed afterwards moves it nowhere.
    @Test func aMemberFromBeforeTheNewPairingKeepsSyncingAndPinsItsFirstEpoch() throws {
        let remote = try makeBareRemote(tmp)
        let (a, b, code) = try founderAndJoiner(remote)
        try pair(b, code: code, approver: a)
        _ = try b.pull()
        // b's state as format 2 stored it: no first epoch, no pairing, none answered, no restore.
        var old = b.replica.state
        old.pinnedFirst = []
        var bytes = Array(old.encoded().dropLast(11))
        bytes[4] = 2
        let upgraded = Machine(replica: SyncReplica(directory: b.replica.directory, keys: b.replica.keys, state: try SyncState.decode(bytes)),
                               git: b.git)
        #expect(upgraded.replica.state.pinnedFirst.isEmpty)
        var keys = SyncDeviceKeys.generate()
        while !(keys.id < a.replica.keys.id) { keys = .generate() }
        let m = try Attacker(try GitTransport.clone(remote: remote, into: tmp.file("m")), keys: keys)
        try m.foundOwnCircle()
        try m.push()
        try a.write("after-upgrade", "v", now: 3_000)
        try a.push()
        _ = try upgraded.pull()
        #expect(upgraded.items["after-upgrade"] == "v")
        #expect(upgraded.replica.state.pinnedFirst == a.replica.state.pinnedFirst && !a.replica.state.pinnedFirst.isEmpty)
    }

    /// A remote whose history only grows but from which the attacker removed the epoch a member saw
    /// (a rewind git cannot see), or whose chain was replaced below it, is refused with the circle's
    /// fingerprint named; nothing is applied.
    @Test func aRewoundCircleIsRefusedNamingTheCircle() throws {
        let remote = try makeBareRemote(tmp)
        let (a, b, code) = try founderAndJoiner(remote)
        try pair(b, code: code, approver: a)
        _ = try a.pull()
        _ = try b.pull()
        let circle = try a.replica.circle()
        #expect(circle.current.epoch == 2)
        let m = try Attacker(try GitTransport.clone(remote: remote, into: tmp.file("m")))
        try FileManager.default.removeItem(atPath: m.git.directory + "/" + circle.current.path)
        try m.push()
        try b.fetch()
        let state = b.replica.state
        do {
            _ = try b.replica.pull()
            Issue.record("a rewound circle was followed")
        } catch {
            #expect(error.message.contains(circle.fingerprint) && error.message.contains("epoch 2"), "\(error)")
        }
        #expect(b.replica.state == state)
    }
}


/// SyncFormat.md's pairing vectors (fence `pairing-vector`): fixed keys, code, session id and CPace
/// scalars give the stated request, response and confirmation bytes, each side accepts the other's,
/// and every altered byte of a message is refused or fails its proof.
@Suite struct SyncPairingVectorTests {
    @Test func theArticlesPairingVectorsHold() throws {
        let blocks = specVectorBlocks("Sources/CofferSync/CofferSync.docc/SyncFormat.md", fence: "pairing-vector")
        #expect(blocks.count >= 1, "SyncFormat.md has its pairing vectors")
        func h(_ key: String, _ v: [String: String]) throws -> [UInt8] { try #require(v[key].flatMap(hexDecode), "\(key)") }
        for v in blocks {
            let jk = try SyncDeviceKeys.restore(ed25519Seed: secure(try h("joiner-ed25519-seed", v)), x25519SecretKey: secure(try h("joiner-x25519-secret", v)))
            let ak = try SyncDeviceKeys.restore(ed25519Seed: secure(try h("approver-ed25519-seed", v)), x25519SecretKey: secure(try h("approver-x25519-secret", v)))
            #expect(ak.id.hex == v["approver-id"])
            let file = SyncDevice(keys: jk, name: v["joiner-name"] ?? "", createdMillis: UInt64(v["joiner-created"] ?? "") ?? 0).encoded(signedWith: jk)
            #expect(Hex.encode(file) == v["joiner-device-file"])
            let code = try #require(SyncPairingCode.parse(v["code"] ?? ""))
            let (joining, request) = try SyncPairing.start(code: code, deviceFile: file, scalar: secure(try h("joiner-scalar", v)), sid: try h("sid", v))
            #expect(Hex.encode(request.encoded) == v["request"])
            let (response, isk) = try SyncPairing.respond(to: request, code: code, approver: ak.id, first: try h("first-epoch-hash", v),
                                                          epoch: try #require(UInt64(v["epoch"] ?? "")), epochHash: try h("epoch-hash", v),
                                                          scalar: secure(try h("approver-scalar", v)))
            #expect(Hex.encode(response.encoded) == v["response"])
            let tag = try SyncPairing.verify(response, joining: joining)
            let confirm = try SyncPairing.Confirm.make(sid: joining.sid, tag: tag)
            #expect(Hex.encode(confirm.encoded) == v["confirm"])
            try SyncPairing.check(confirm, request: request, isk: isk)
            #expect(SyncCircle.fingerprint(firstEpochHash: try h("first-epoch-hash", v)) == v["fingerprint"])
            // Any byte of the response altered: malformed, or its proof fails.
            for i in 0..<response.encoded.count {
                var bad = response.encoded
                bad[i] ^= 0x01
                #expect(throws: SyncError.self) { _ = try SyncPairing.verify(try SyncPairing.Response.decode(bad), joining: joining) }
            }
            for i in 0..<confirm.encoded.count {
                var bad = confirm.encoded
                bad[i] ^= 0x01
                #expect(throws: SyncError.self) { try SyncPairing.check(try SyncPairing.Confirm.decode(bad), request: request, isk: isk) }
            }
        }
    }
}
