import CofferClient
import CofferModel
import CofferSystem
import Glibc

/// `coffer get` is what scripts call in loops, so its whole-process time matters (target ≤ 5 ms).
/// swift-argument-parser's start-up (reflection over the command tree, protocol-conformance scans of
/// a large static binary) costs a few milliseconds; the plain form `get --service S --account A
/// [--server H] [--socket P]` is therefore parsed here directly. Anything else — other options,
/// `--help`, a malformed line — falls through to the full parser, which gives the same result and
/// the usual messages.
enum FastPath {
    /// Runs the fast path if the arguments fit it; returns the exit status, or nil to fall through.
    static func run(_ args: [String]) -> Int32? {
        guard args.count >= 3, args[0] == "get", args.count % 2 == 1 else { return nil }
        var options: [String: String] = [:]
        for i in stride(from: 1, to: args.count, by: 2) {
            let key = args[i]
            guard ["--service", "--account", "--server", "--socket"].contains(key), options[key] == nil else { return nil }
            options[key] = args[i + 1]
        }
        var attrs: Attributes = [:]
        if let s = options["--service"] { attrs["svce"] = .string(s) }
        if let a = options["--account"] { attrs["acct"] = .string(a) }
        if let h = options["--server"] { attrs["srvr"] = .string(h) }
        guard !attrs.isEmpty else { return nil }
        let query = ItemQuery(itemClass: options["--server"] == nil ? .genericPassword : .internetPassword,
                              attributes: attrs, limit: .one, returnData: true)
        do throws(SecError) {
            let connection = try AgentConnection(path: try AgentConnection.socketPath(explicit: options["--socket"]), clientName: "coffer")
            guard let data = try connection.copyMatching(query).first?.data else { throw .itemNotFound() }
            let ok = data.withUnsafeBytes { StandardStreams.write(1, $0) }
            if isatty(1) == 1 { _ = [UInt8(0x0A)].withUnsafeBytes { StandardStreams.write(1, $0) } }
            if !ok { throw .io("cannot write to standard output") }
            return 0
        } catch {
            StandardStreams.printError("coffer: \(error.description)")
            return error.status.exitCode
        }
    }
}
