import CofferCrypto
import CofferPluginHost
import CofferPluginProtocol
import CofferSystem
import Foundation
import Testing

struct PluginVector: CustomTestStringConvertible, Sendable {
    var name = "", direction = "", outcome = ""
    var frame: [UInt8] = []
    var testDescription: String { name }
}

/// The ```vector blocks of PluginProtocol.md, so the document and the code cannot drift apart.
let pluginVectors: [PluginVector] = {
    let doc = PluginBinaries.packageRoot + "/Sources/CofferPluginProtocol/CofferPluginProtocol.docc/PluginProtocol.md"
    let text = (try? String(contentsOfFile: doc, encoding: .utf8)) ?? ""
    var out: [PluginVector] = []
    var current: PluginVector? = nil
    for line in text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
        if line == "```vector" { current = PluginVector(); continue }
        guard var v = current else { continue }
        if line == "```" { out.append(v); current = nil; continue }
        let parts = line.split(separator: ":", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
        guard parts.count == 2 else { continue }
        switch parts[0] {
        case "name": v.name = parts[1]
        case "direction": v.direction = parts[1]
        case "outcome": v.outcome = parts[1]
        case "frame":
            let h = Array(parts[1].utf8)
            v.frame = stride(from: 0, to: h.count - 1, by: 2).map { UInt8(String(decoding: h[$0..<$0 + 2], as: UTF8.self), radix: 16)! }
        default: break
        }
        current = v
    }
    return out
}()

/// Decodes a whole frame as the receiver would: nil for a framing error.
func decode(_ frame: [UInt8], direction: String) -> Result<[UInt8], PluginProtocolError>? {
    guard frame.count >= 4, let length = PluginWire.bodyLength(Array(frame[0..<4])) else { return nil }
    guard frame.count - 4 == length else { return .failure(PluginProtocolError("length prefix does not match")) }
    let body = Array(frame[4...])
    do {
        if direction == "request" {
            let (id, r) = try HostRequest.decodeBody(body)
            return .success(r.encodeFrame(id: id))
        }
        let (id, r) = try HostResponse.decodeBody(body)
        return .success(r.encodeFrame(id: id))
    } catch { return .failure(error) }
}

@Suite struct PluginVectorTests {
    @Test func theSpecHasVectorsOfEveryOutcomeAndMessage() {
        #expect(pluginVectors.count >= 20)
        #expect(Set(pluginVectors.map(\.outcome)) == ["ok", "malformed", "close"])
        let okTypes = Set(pluginVectors.filter { $0.outcome == "ok" }.map { $0.frame[4] })
        #expect(okTypes == [0x01, 0x02, 0x03, 0x04, 0x05, 0x81, 0x82, 0x84, 0x85, 0xC1, 0xFF])
    }

    @Test(arguments: pluginVectors)
    func vector(_ v: PluginVector) throws {
        let result = decode(v.frame, direction: v.direction)
        switch v.outcome {
        case "close": #expect(result == nil)
        case "ok": #expect(try #require(result).get() == v.frame)
        case "malformed":
            guard case .failure = try #require(result) else { Issue.record("decoded a malformed frame"); return }
        default: Issue.record("unknown outcome \(v.outcome)")
        }
    }

    /// Every truncation of every valid frame is a clean error (never a crash or a decode).
    @Test func everyTruncationIsACleanError() {
        for v in pluginVectors where v.outcome == "ok" {
            let body = Array(v.frame[4...])
            for cut in 0..<body.count {
                let short = Array(body[..<cut])
                if v.direction == "request" {
                    #expect(throws: PluginProtocolError.self) { try HostRequest.decodeBody(short) }
                } else {
                    #expect(throws: PluginProtocolError.self) { try HostResponse.decodeBody(short) }
                }
            }
        }
    }

    @Test func randomGarbageNeverCrashesTheDecoders() {
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<20_000 {
            let body = (0..<Int.random(in: 0...64, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            _ = try? HostRequest.decodeBody(body)
            _ = try? HostResponse.decodeBody(body)
        }
    }

    @Test func theCredentialDecodesIntoSecureBytes() throws {
        let v = try #require(pluginVectors.first { $0.name.hasPrefix("evaluate passcode with credential") })
        let (_, request) = try HostRequest.decodeBody(Array(v.frame[4...]))
        guard case let .evaluate(_, _, _, _, credential?) = request else { Issue.record("no credential"); return }
        #expect(credential.withUnsafeBytes { Array($0) } == Array("1234".utf8))
    }
}

/// The host's server in-process, over a socket pair, with no plugins: first-frame and framing rules.
@Suite struct PluginServerFramingTests {
    func withServer(_ body: (Int32) throws -> Void) throws {
        var fds: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        let serverFD = fds[1]
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            PluginHostServer(fd: serverFD, load: LoadResult()).serve()
            close(serverFD)
            done.signal()
        }
        defer { close(fds[0]); done.wait() }
        var tv = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fds[0], SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        try body(fds[0])
    }

    func send(_ fd: Int32, _ bytes: [UInt8]) { _ = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } }

    /// The next frame, or nil at EOF.
    func receive(_ fd: Int32) -> (UInt32, HostResponse)? {
        func exactly(_ n: Int) -> [UInt8]? {
            var b = [UInt8](repeating: 0, count: n), off = 0
            while off < n {
                let r = b.withUnsafeMutableBytes { read(fd, $0.baseAddress! + off, n - off) }
                if r <= 0 { return nil }
                off += r
            }
            return b
        }
        guard let h = exactly(4), let n = PluginWire.bodyLength(h), let body = exactly(n) else { return nil }
        return try? HostResponse.decodeBody(body)
    }

    @Test func aFirstFrameOtherThanHelloGetsAnErrorAndTheHostCloses() throws {
        try withServer { fd in
            send(fd, HostRequest.state(plugin: "test").encodeFrame(id: 4))
            let r = try #require(receive(fd))
            #expect(r.0 == 4)
            guard case .error(1, _) = r.1 else { Issue.record("expected ERROR 1, got \(r.1)"); return }
            #expect(receive(fd) == nil)
        }
    }

    @Test func helloThenGarbageGetsCleanErrorsAndTheConnectionStaysOpen() throws {
        try withServer { fd in
            send(fd, HostRequest.hello(minVersion: 1, maxVersion: 3).encodeFrame(id: 0))
            guard case .helloReply(1, [], [])? = receive(fd)?.1 else { Issue.record("no HELLO_REPLY"); return }
            for v in pluginVectors where v.outcome == "malformed" && v.direction == "request" {
                send(fd, v.frame)
                guard case .error(1, let message)? = receive(fd)?.1 else { Issue.record("no ERROR for \(v.name)"); continue }
                #expect(message.hasPrefix("malformed request"))
            }
            send(fd, HostRequest.hello(minVersion: 1, maxVersion: 1).encodeFrame(id: 0))
            guard case .error(1, _)? = receive(fd)?.1 else { Issue.record("a second HELLO was accepted"); return }
            send(fd, HostRequest.evaluate(plugin: "none", reason: "r", app: "a", timeoutMillis: 10, credential: nil).encodeFrame(id: 5))
            guard case .error(2, _)? = receive(fd)?.1 else { Issue.record("no ERROR 2 for an unknown plugin"); return }
            // A length outside the limits closes the connection without a reply.
            send(fd, [0x00, 0x01, 0x00, 0x01, 0x01])
            #expect(receive(fd) == nil)
        }
    }

    @Test func helloWithoutVersionOneIsRefused() throws {
        try withServer { fd in
            send(fd, HostRequest.hello(minVersion: 2, maxVersion: 9).encodeFrame(id: 0))
            guard case .error(4, _)? = receive(fd)?.1 else { Issue.record("no ERROR 4"); return }
            #expect(receive(fd) == nil)
        }
    }
}
