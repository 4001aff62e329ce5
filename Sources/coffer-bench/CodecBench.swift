import CofferCrypto
import CofferKeychain
import CofferModel
import CofferProtocol
import Glibc

/// `coffer-bench codec [N] [RUNS]`: where a search returning every item's attributes spends its time
/// outside the socket and the bus (issue #26's bulk read: the Secret Service front end's SearchItems of
/// N items, default 1,000). The same N items as `fill-secret-service`, in a library keychain in a
/// temporary directory; each row is the median over RUNS (default 51) of one pass over all N:
///
/// - the keychain's search (open every row, decode, match), as the agent runs it;
/// - the agent's reply frame (ITEMS with attributes and references), and the front end's decode of it;
/// - the attribute codec alone: encode and decode of every item's attribute dictionary.
///
/// The peer column is the keychain search itself: each part's share of it, so a change to the codec is
/// read against the work the agent cannot avoid, measured in the same run.
func benchCodec(items n: Int, runs: Int) throws {
    let dir = makeTempDir()
    defer { _ = system("rm -rf '\(dir)'") }
    let kc = try Keychain(directory: dir)
    try kc.add(contentsOf: (1...n).map(secretServiceItem), scope: .unrestricted)
    let query = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("org.freedesktop.secrets")],
                          limit: .all, returnAttributes: true, returnPersistentRef: true)
    let results = try kc.copyMatching(query, scope: .unrestricted)
    precondition(results.count == n, "codec: \(results.count) items found for \(n)")
    let attrs = results.map { $0.attributes! }
    let encoded = attrs.map { AttributeCodec.encode($0) }
    let frame = AgentResponse.items(results).encodeFrame(requestID: 1)
    let body = Array(frame.dropFirst(WireFormat.headerBytes))

    func median(_ body: () throws -> Void) rethrows -> Double {
        var xs: [UInt64] = []
        for _ in 0..<runs {
            let t0 = nowNanos()
            try body()
            xs.append(nowNanos() - t0)
        }
        return percentile(xs, 0.5) / 1000 // ms
    }
    var sink = 0
    let search = try median { sink &+= try kc.copyMatching(query, scope: .unrestricted).count }
    let reply = median { sink &+= AgentResponse.items(results).encodeFrame(requestID: 1).count }
    let decode = try median {
        sink &+= try decodedItems(body)
    }
    let encodeAttrs = median { for a in attrs { sink &+= AttributeCodec.encode(a).count } }
    let decodeAttrs = try median {
        for e in encoded {
            var r = ByteReader(e)
            sink &+= try AttributeCodec.decodeAttributes(from: &r).count
        }
    }
    precondition(sink != 0)
    func row(_ name: String, _ ms: Double) {
        print("| \(name) | \(fixed(ms, 2)) | \(fixed(ms / search, 2)) |")
    }
    print("| \(n) items, \(attrs[0].count) attributes each (median of \(runs)) | ms | ÷ keychain search |")
    print("|---|---:|---:|")
    row("keychain search (open, decode, match every row)", search)
    row("agent: ITEMS reply frame (attributes + references)", reply)
    row("front end: decode of that frame", decode)
    row("AttributeCodec.encode of every item", encodeAttrs)
    row("AttributeCodec.decodeAttributes of every item", decodeAttrs)
}

/// How many items an ITEMS frame body holds, decoded as a client decodes it.
private func decodedItems(_ body: [UInt8]) throws -> Int {
    let r = try body.withUnsafeBytes { b in try AgentResponse.decodeBody(b).1 }
    guard case .items(let got) = r else { return 0 }
    return got.count
}
