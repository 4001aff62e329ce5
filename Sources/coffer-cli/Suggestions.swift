import ArgumentParser
import CofferModel

/// "Did you mean 'find'?" for a mistyped command, as swift-argument-parser already says for a
/// mistyped option (it only says "Unexpected argument" for a command).
enum CommandSuggestion {
    /// The message for the first word of `arguments` that should name a command (of `root`, or of a
    /// command group such as `passcode`) and names none, with the command names of that group (the
    /// path to it too); nil when there is none, when an option comes first (the parser's own
    /// messages cover those), or for `help`.
    static func message(for arguments: [String], root: any ParsableCommand.Type) -> String? {
        var subcommands = configuration(of: root).subcommands
        for word in arguments {
            guard !subcommands.isEmpty, !word.hasPrefix("-"), word != "help" else { return nil }
            if let next = subcommands.first(where: { name(of: $0) == word || configuration(of: $0).aliases.contains(word) }) {
                subcommands = configuration(of: next).subcommands
                continue
            }
            let names = subcommands.map { name(of: $0) }
            let best = names.min { editDistance(word, $0) < editDistance(word, $1) }!
            let prefixed = names.filter { $0.hasPrefix(word) }
            // Echoed escaped: the word came from the command line and may hold control characters.
            let shown = Output.escapedText(word)
            if prefixed.count == 1 || editDistance(word, best) <= max(1, best.count / 3) {
                return "Unknown command '\(shown)'. Did you mean '\(prefixed.count == 1 ? prefixed[0] : best)'?"
            }
            return "Unknown command '\(shown)'. Commands: \(names.joined(separator: ", "))."
        }
        return nil
    }

    private static func configuration<C: ParsableCommand>(of command: C.Type) -> CommandConfiguration { C.configuration }
    private static func name<C: ParsableCommand>(of command: C.Type) -> String { C._commandName }

    /// Exits with the usage error (status 64) if `arguments` mistype a command.
    static func check<Root: ParsableCommand>(_ arguments: [String], root: Root.Type) {
        guard let text = message(for: arguments, root: root) else { return }
        Root.exit(withError: ValidationError(text))
    }

    static func editDistance(_ a: String, _ b: String) -> Int { Spelling.distance(a, b) }
}
