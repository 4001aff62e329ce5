import ArgumentParser
import CofferClient
import CofferModel

/// Values the shell completions offer (swift-argument-parser's `---completion` calls these):
/// accessibility classes, access-control forms, item classes, and the service and account names of
/// the caller's own items.
enum ValueCompletion {
    /// `--accessible`: every class's CLI name and Apple's short codes.
    static let accessible: CompletionKind = .list(ProtectionClass.allCases.map(\.cliName) + ProtectionClass.allCases.map(\.shortCode))

    /// `--class`.
    static let itemClass: CompletionKind = .list(ItemClass.allCases.map(\.rawValue))

    /// `--access-control`: a factor, or, after `FACTOR,`, a joiner, or, after `…,or,`, another factor.
    static let accessControl: CompletionKind = .custom { _, _, prefix in accessControlValues(prefix) }

    static func accessControlValues(_ prefix: String) -> [String] {
        let parts = prefix.split(separator: ",", omittingEmptySubsequences: false)
        let head = parts.dropLast().joined(separator: ",")
        let lead = head.isEmpty ? "" : head + ","
        // Even positions are factors, odd ones joiners (one kind of joiner per rule).
        let joiner = parts.count >= 3 ? String(parts[1]) : nil
        let candidates = parts.count % 2 == 1 ? AccessControl.Factor.allCases.map(\.name) : (joiner.map { [$0] } ?? ["or", "and"])
        return candidates.map { lead + $0 }.filter { $0.hasPrefix(prefix) }
    }

    /// `--service` (svce) and `--account` (acct): the names on the caller's own items.
    static func names(_ key: String) -> CompletionKind {
        .custom { words, _, prefix in itemNames(key, words: words, prefix: prefix) }
    }

    /// The values of `key` on the items of the caller's own access groups (WHOAMI's: never a group
    /// the shell helper was authorized for, whose reuse window would otherwise widen the agent's
    /// scope for it), filtered by the service or account already on the command line. Attributes
    /// only, never a secret; nothing when there is no agent or it is locked; never asks anybody (no
    /// prompt, no-UI) and gives up on an agent that does not answer within a few seconds, so
    /// completing never waits for a person.
    static func itemNames(_ key: String, words: [String], prefix: String) -> [String] {
        var given: [String: String] = [:]
        var i = 0
        while i < words.count {
            let w = words[i]
            if let eq = w.firstIndex(of: "="), w.hasPrefix("--") {
                given[String(w[..<eq])] = String(w[w.index(after: eq)...])
            } else if w.hasPrefix("--"), i + 1 < words.count, !words[i + 1].hasPrefix("-") {
                given[w] = words[i + 1]
                i += 1
            }
            i += 1
        }
        guard let c = try? AgentConnection(path: AgentConnection.socketPath(explicit: given["--socket"]), clientName: "coffer-completion",
                                           replyTimeout: 5),
              let status = try? c.status(), status.lockState == .unlocked,
              let own = try? c.whoami().accessGroups,
              (try? c.setAuthenticationOptions(AuthenticationOptions(noUserInterface: true))) != nil else { return [] }
        var attributes: Attributes = [:]
        if key != "svce", let s = given["--service"] { attributes["svce"] = .string(s) }
        if key != "acct", let a = given["--account"] { attributes["acct"] = .string(a) }
        var items: [ItemResult] = []
        for group in own {
            attributes["agrp"] = .string(group)
            items += (try? c.copyMatching(ItemQuery(itemClass: nil, attributes: attributes, limit: .all, returnAttributes: true))) ?? []
        }
        var names = Set<String>()
        for item in items {
            // A name with a control character (a newline would split it) is not offered.
            if case .string(let s)? = item.attributes?[key], s.hasPrefix(prefix),
               !s.unicodeScalars.contains(where: { TerminalSafeText.isTerminalHazard($0) }) {
                names.insert(s)
            }
        }
        return names.sorted()
    }
}
