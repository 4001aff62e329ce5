import CofferClient
import CofferCrypto
import CofferModel
import CofferProtocol
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// Protocol version 4's limits on a real agent: a 1 MiB secret, 160 general attributes with 255-byte
/// names, each round-tripping whole and refused cleanly one step above; and a version 3 connection
/// beside it sees what it saw before (WireProtocol.md, Versioning).
@Suite struct LargeItemTests {
    /// 160 general attributes, each named with 255 bytes (a distinct prefix, then padding), with short
    /// values: 160 × 258 bytes, within the 64 KiB the general attributes may hold together.
    static func wide(_ count: Int = GeneralAttributes.maxCount, nameBytes: Int = GeneralAttributes.maxNameBytes) -> Attributes {
        var a: Attributes = ["svce": .string("wide"), "acct": .string("me")]
        for i in 0..<count {
            let prefix = String(format: "%03d", i)
            a[GeneralAttributes.key(prefix + String(repeating: "n", count: nameBytes - prefix.utf8.count))] = .string("v\(i)")
        }
        return a
    }

    static func array(_ s: SecureBytes) -> [UInt8] { s.withUnsafeBytes { Array($0) } }

    static func bytes(_ n: Int) -> [UInt8] { (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 9) } }

    /// The harness feeds a large input to a program that exits without reading it (as `secret-tool
    /// store` does past 8 KiB): the runner gets the program's status, and is neither blocked nor
    /// killed by SIGPIPE (which once ended a whole test process).
    @Test func aChildThatLeavesALargeInputUnreadDoesNotStopTheRunner() {
        let big = String(repeating: "x", count: 2 * 1_048_576)
        let r = runProcess("/bin/sh", ["-c", "head -c 10 >/dev/null; echo read; exit 3"], stdin: big, timeout: 60)
        #expect(r.status == 3 && r.stdout == "read\n", "\(r)")
        let quiet = runProcess("/bin/true", [], stdin: big, timeout: 60)
        #expect(quiet.status == 0, "\(quiet)")
    }

    @Test func aOneMebibyteSecretAndTheWidestItemRoundTripAndOneMoreIsRefused() throws {
        let agent = try AgentProcess()
        let c = try AgentConnection(path: agent.socketPath)
        #expect(c.version == WireFormat.largeFramesVersion)

        // The largest secret, whole, with its attributes.
        let content = Self.bytes(WireFormat.maximumSecretBytes)
        try c.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("kube"), "acct": .string("config")],
                          secret: content.withUnsafeBytes { SecureBytes(copying: $0) }))
        let got = try c.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("kube")], limit: .one,
                                               returnData: true, returnAttributes: true))
        #expect(got.count == 1 && got[0].data.map(Self.array) == content)

        // One byte more: refused by name and limit; the connection is served on.
        let over = failure { () throws(SecError) in
            try c.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("kube"), "acct": .string("over")],
                              secret: secret(count: WireFormat.maximumSecretBytes + 1)))
        }
        #expect(over?.status == .param && over?.message.contains("\(WireFormat.maximumSecretBytes)") == true, "\(String(describing: over))")
        #expect(try c.status().itemCount == 1)

        // 160 general attributes with 255-byte names: stored, returned and searchable.
        let wide = Self.wide()
        try c.add(NewItem(itemClass: .genericPassword, attributes: wide, secret: secret("w")))
        let back = try c.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("wide")], limit: .one,
                                                returnAttributes: true))
        #expect(back.count == 1)
        let general = back.first?.attributes?.filter { GeneralAttributes.isGeneral($0.key) } ?? [:]
        #expect(general == wide.filter { GeneralAttributes.isGeneral($0.key) }, "\(general.count) general attributes came back")
        let oneName = try #require(wide.keys.first { GeneralAttributes.isGeneral($0) && $0.contains("@042") })
        let found = try c.copyMatching(ItemQuery(attributes: [oneName: .string("v42")], limit: .all, returnData: true))
        #expect(found.count == 1 && found[0].data.map(Self.array) == Array("w".utf8))

        // One more attribute, one byte longer a name: refused, and nothing is added.
        for (what, attrs) in [("161 attributes", Self.wide(GeneralAttributes.maxCount + 1)),
                              ("a 256-byte name", Self.wide(1, nameBytes: GeneralAttributes.maxNameBytes + 1))] {
            var a = attrs
            a["acct"] = .string("other")
            let refused = failure { () throws(SecError) in try c.add(NewItem(itemClass: .genericPassword, attributes: a, secret: secret("x"))) }
            #expect(refused?.status == .param, "\(what): \(String(describing: refused))")
        }
        #expect(try c.status().itemCount == 2)

        // The CLI: a 1 MiB secret in through standard input (its one trailing newline dropped), and out
        // byte for byte; one byte more is refused by name and limit.
        let text = String(repeating: "apiVersion: v1\n", count: WireFormat.maximumSecretBytes / 15) + "x"
        #expect(text.utf8.count == WireFormat.maximumSecretBytes)
        let add = agent.cli(["add", "--service", "cli", "--account", "big", "--secret-stdin"], stdin: text + "\n")
        #expect(add.status == 0, "\(add.stderr)")
        let get = agent.cli(["get", "--service", "cli", "--account", "big"])
        #expect(get.status == 0 && get.stdout == text, "\(get.stderr) \(get.stdout.utf8.count) bytes")
        let tooLong = agent.cli(["add", "--service", "cli", "--account", "over", "--secret-stdin"], stdin: text + "y")
        #expect(tooLong.status != 0 && tooLong.stderr.contains("\(WireFormat.maximumSecretBytes)"), "\(tooLong.stderr)")
    }

    /// A version 3 connection beside them: the 1 MiB item is refused with errSecAllocate when asked
    /// for with its data, the wide item when asked for with its attributes (names its decoder refuses);
    /// a persistent reference reaches both; a request with a 33-byte name is errSecParam naming version
    /// 4; and a frame over 256 KiB still closes its connection, while at version 4 one over 1.5 MiB does.
    @Test func aVersionThreeConnectionSeesWhatItSawBefore() throws {
        let agent = try AgentProcess()
        let v4 = try AgentConnection(path: agent.socketPath)
        try v4.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("kube")], secret: secret(count: WireFormat.maximumSecretBytes)))
        try v4.add(NewItem(itemClass: .genericPassword, attributes: Self.wide(), secret: secret("w")))

        let v3 = try AgentConnection(path: agent.socketPath, maximumVersion: 3)
        #expect(v3.version == 3)
        let data = failure { () throws(SecError) in
            _ = try v3.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("kube")], limit: .one, returnData: true))
        }
        #expect(data?.status == .allocate, "\(String(describing: data))")
        let attrs = failure { () throws(SecError) in
            _ = try v3.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("wide")], limit: .one, returnAttributes: true))
        }
        #expect(attrs?.status == .allocate && attrs?.message.contains("version 4") == true, "\(String(describing: attrs))")
        let refs = try v3.copyMatching(ItemQuery(itemClass: .genericPassword, limit: .all, returnPersistentRef: true))
        #expect(refs.count == 2)
        let longName = failure { () throws(SecError) in
            _ = try v3.copyMatching(ItemQuery(attributes: [GeneralAttributes.key(String(repeating: "n", count: 32)): .string("v")]))
        }
        #expect(longName?.status == .param && longName?.message.contains("version 4") == true, "\(String(describing: longName))")
        // The client keeps to the version's frame: a 300 KiB secret is not sent at version 3.
        let tooLarge = failure { () throws(SecError) in
            try v3.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("x")], secret: secret(count: 300 * 1024)))
        }
        #expect(tooLarge?.status == .param && tooLarge?.message.contains("version") == true, "\(String(describing: tooLarge))")
        #expect(try v3.status().itemCount == 2)

        // Raw frames: a length the connection's version does not allow closes it, without a reply.
        for (version, length) in [(UInt16(3), WireFormat.maximumBodyBytes + 1), (4, WireFormat.maximumLargeBodyBytes + 1)] {
            let fd = try UnixSocket.connect(path: agent.socketPath)
            defer { close(fd) }
            let hello = AgentRequest.hello(minVersion: version, maxVersion: version, clientName: "raw").encodeFrame(requestID: 1)
            #expect(hello.withUnsafeBytes { UnixSocket.writeAll(fd, $0) })
            var header: UInt32 = 0
            #expect(withUnsafeMutableBytes(of: &header) { UnixSocket.readExactly(fd, into: $0) })
            var body = [UInt8](repeating: 0, count: Int(UInt32(bigEndian: header)))
            #expect(body.withUnsafeMutableBytes { UnixSocket.readExactly(fd, into: $0) })
            guard case .helloReply(let agreed, _)? = try? body.withUnsafeBytes({ try AgentResponse.decodeBody($0) }).1 else {
                Issue.record("no HELLO_REPLY at version \(version)"); continue
            }
            #expect(agreed == version)
            let announced = UInt32(length).bigEndian
            #expect(withUnsafeBytes(of: announced) { UnixSocket.writeAll(fd, $0) })
            var byte: UInt8 = 0
            #expect(recv(fd, &byte, 1, 0) == 0, "version \(version): a \(length)-byte frame must close the connection")
        }
        // One exactly at the version 4 limit is read (and, malformed, answered -50 on an open connection).
        let fd = try UnixSocket.connect(path: agent.socketPath)
        defer { close(fd) }
        var frame = AgentRequest.hello(minVersion: 4, maxVersion: 4, clientName: "raw").encodeFrame(requestID: 1)
        frame += [0x00, 0x18, 0x00, 0x00, MessageType.status.rawValue, 0, 0, 0, 2] + [UInt8](repeating: 0, count: WireFormat.maximumLargeBodyBytes - 5)
        #expect(frame.withUnsafeBytes { UnixSocket.writeAll(fd, $0) })
        var replies: [AgentResponse] = []
        for _ in 0..<2 {
            var header: UInt32 = 0
            guard withUnsafeMutableBytes(of: &header, { UnixSocket.readExactly(fd, into: $0) }) else { break }
            var body = [UInt8](repeating: 0, count: Int(UInt32(bigEndian: header)))
            guard body.withUnsafeMutableBytes({ UnixSocket.readExactly(fd, into: $0) }) else { break }
            if let r = try? body.withUnsafeBytes({ try AgentResponse.decodeBody($0) }).1 { replies.append(r) }
        }
        #expect(replies.count == 2)
        if case .error(let e)? = replies.last { #expect(e.status == .param) } else { Issue.record("\(replies)") }
    }
}
