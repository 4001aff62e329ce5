import CofferModel
import CofferSync
import CofferTestSupport
import Foundation
import Testing

/// The third review's F3 (issue #41) end to end: real agents syncing through a bare repository with
/// the real `git`, and an attacker who can write that repository (a clone of its own, writing what it
/// likes with Coffer's own sync library, as anyone could). Before the pairing redesign, attack 1
/// made the joiner a member of the attacker's circle and attack 2 made the founder refuse every sync;
/// now neither moves anything, and the person's own approval still works.
@Suite(.serialized) struct SyncPairingAttackTests {
    let h = SyncAgentTests()

    /// The attacker's clone and keys.
    final class Attacker {
        let git: GitTransport
        let keys: SyncDeviceKeys
        var head = ""
        init(_ git: GitTransport, keys: SyncDeviceKeys = .generate()) throws {
            (self.git, self.keys) = (git, keys)
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
        var device: SyncDevice { SyncDevice(keys: keys, name: "laptop", createdMillis: 1_000) }
        /// A circle of its own: its device file and first epoch, written.
        func foundOwnCircle() throws -> SyncCircle {
            try write(device.path, device.encoded(signedWith: keys))
            let first = try SyncCircle.found(by: keys, device: device)
            try write(first.path, first.encoded)
            return try SyncCircle.resolve(epochFiles: [first.path: first.encoded], devices: [keys.id: device], pinned: nil, first: first.hash).circle
        }
    }

    /// The circle fingerprint `coffer sync status` shows ("none yet" before a pairing proved one).
    static func circle(_ m: SyncAgentTests.Machine) -> String {
        m.status().split(separator: "\n").first { $0.hasPrefix("circle: ") }.map { String($0.dropFirst("circle: ".count)) } ?? "?"
    }

    func founder() throws -> SyncAgentTests.Machine {
        let r = runProcess("/usr/bin/git", ["init", "-q", "--bare", h.remote])
        try #require(r.status == 0, "git init --bare: \(r)")
        let a = try SyncAgentTests.Machine("laptop", config: try h.config("a"))
        a.add("before", "pw0")
        let founded = a.cli(["sync", "init", "--remote", h.remote, "--name", "laptop"])
        try #require(founded.status == 0, "sync init: \(founded)\n\(a.agent.log)")
        return a
    }

    /// `machine` asks to join without waiting; its code.
    func join(_ machine: SyncAgentTests.Machine) throws -> String {
        let joined = machine.cli(["sync", "join", "--remote", h.remote, "--name", machine.name, "--wait", "0"])
        return try #require(SyncAgentTests.code(in: joined.stdout), "join: \(joined)\n\(machine.agent.log)")
    }

    /// `approver` approves `code`; its output.
    func approve(_ approver: SyncAgentTests.Machine, _ code: String) -> CLIResult {
        approver.cli(["sync", "approve", code, "--auth-passcode-fd", "0"], stdin: approver.passcode)
    }

    /// Attack 1: the attacker founds its own circle on the remote, answers the joiner's request with a
    /// guessed code (the request does not reveal it) and writes an epoch "admitting" it. The joiner's
    /// agent refuses the answer, says so in `coffer sync status` (and `--now` fails), and is in no
    /// circle; joining again with a new code and the person's approval then works.
    @Test func aRemoteWriterWhoFoundsACircleCannotCaptureAJoiningMachine() throws {
        let a = try founder()
        let b = try SyncAgentTests.Machine("desktop", config: try h.config("b"))
        let code = try join(b)
        let m = try Attacker(try GitTransport.clone(remote: h.remote, into: h.shared.file("attacker")))
        let own = try m.foundOwnCircle()
        let dir = try #require(SyncPairingCode.parse(code)).directory
        let request = try SyncPairing.Request.decode(try #require(m.read(dir + "/request"), "no request on the remote"))
        let guess = try #require(SyncPairingCode.parse(String(code.prefix(5)) + "QQQQ-QQQQ"))
        let (response, _) = try SyncPairing.respond(to: request, code: guess, approver: m.keys.id, circle: own)
        try m.write(dir + "/response", response.encoded)
        let admitting = try own.next(signedBy: m.keys, adding: [request.device])
        try m.write(admitting.path, admitting.encoded)
        try m.push()
        #expect(h.eventually { b.cli(["sync", "status"]).stdout.contains("pairing failed") }, "\(b.cli(["sync", "status"]))\n\(b.agent.log)")
        let now = b.cli(["sync", "status", "--now"])
        #expect(now.status != 0 && now.stdout.contains("does not prove the code"), "\(now)")
        #expect(!b.status().contains("member of the circle"))
        #expect(Self.circle(b) == "none yet", "the joiner took no circle")
        // The person starts again: a new code, approved on the real founder.
        let again = try join(b)
        #expect(again != code)
        let approved = approve(a, again)
        #expect(approved.status == 0, "\(approved)\n\(a.agent.log)\n\(b.agent.log)")
        #expect(h.eventually { b.password("before") == "pw0" }, "\(b.status())")
        #expect(Self.circle(b) == Self.circle(a) && Self.circle(a).count == 17)
    }

    /// Attack 2: with push access only, a second first epoch whose signer sorts before the founder's,
    /// pushed before two machines join. Both join the founder's circle through the person's approvals,
    /// the founder keeps syncing, items reach all three, and the forged epoch is named as refused.
    @Test func aCompetingFirstEpochNeitherCapturesTheJoinersNorStopsTheFounder() throws {
        let a = try founder()
        let devices = a.cli(["sync", "devices"]).stdout
        let founderID = try #require(devices.split(whereSeparator: { $0 == " " || $0 == "\n" || $0 == "\t" }).map(String.init)
                                        .first { $0.count == 32 && $0.allSatisfy(\.isHexDigit) }, "no device id in: \(devices)")
        var keys = SyncDeviceKeys.generate()
        while !(keys.id.hex < founderID) { keys = .generate() }
        let m = try Attacker(try GitTransport.clone(remote: h.remote, into: h.shared.file("attacker")), keys: keys)
        _ = try m.foundOwnCircle()
        try m.push()
        let b = try SyncAgentTests.Machine("desktop", config: try h.config("b"))
        let c = try SyncAgentTests.Machine("server", config: try h.config("c"))
        for machine in [b, c] {
            let code = try join(machine)
            let approved = approve(a, code)
            try #require(approved.status == 0, "\(approved)\n\(a.agent.log)\n\(machine.agent.log)")
            #expect(h.eventually { machine.status().contains("member of the circle") }, "\(machine.status())")
        }
        let fingerprint = Self.circle(a)
        #expect(fingerprint.count == 17)
        for machine in [b, c] {
            #expect(Self.circle(machine) == fingerprint)
            #expect(h.eventually { machine.password("before") == "pw0" })
        }
        c.add("from-c", "pw-c")
        #expect(h.eventually { a.password("from-c") == "pw-c" && b.password("from-c") == "pw-c" })
        let now = a.cli(["sync", "status", "--now"])
        #expect(now.status == 0 && now.stdout.contains("last error: none"), "the founder keeps syncing: \(now)")
    }
}
