// `coffer run` and `coffer inject`: secrets handed to commands and templates by reference
// (SecretReference: coffer://SERVICE/ACCOUNT, coffer-inet://ACCOUNT@SERVER/PATH).
import ArgumentParser
import CofferCLISupport
import CofferClient
import CofferCrypto
import CofferModel
import CofferSystem
import Glibc

/// Fetches the secrets of references, all before anything is run or written: the first reference that
/// names no item (or that the agent refuses) fails the whole command.
func resolve(_ references: [SecretReference], on c: AgentConnection) throws(SecError) -> [SecureBytes] {
    var secrets: [SecureBytes] = []
    for r in references {
        let q = ItemQuery(itemClass: r.itemClass, attributes: r.attributes, limit: .one, returnData: true)
        let group = r.attributes.accessGroup
        let found: [ItemResult]
        do {
            found = try authorizingIfNeeded(c, group: group) { c throws(SecError) in try c.copyMatching(q) }
        } catch {
            throw SecError(error.status, "\(Output.escapedText(r.text)): \(error.message)")
        }
        guard let data = found.first?.data else { throw .itemNotFound("\(Output.escapedText(r.text)): no matching item") }
        secrets.append(data)
    }
    return secrets
}

struct Run: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run a command with secrets in its environment (and nowhere else).",
        discussion: """
            Every --env NAME=REFERENCE, and every inherited variable whose value is a reference, is fetched \
            first; if any names no item (or the agent refuses it) the command does not start and coffer \
            exits with that error's status. Then coffer replaces itself with COMMAND (found on PATH), so \
            COMMAND's exit status is the command's own (127 if it is not found, 126 if it cannot be run, \
            as with env). The secrets are in COMMAND's environment only: \
            never in arguments, files, or coffer's output.

            References: coffer://SERVICE[/ACCOUNT][?group=G] (a generic password), \
            coffer-inet://[ACCOUNT@]SERVER[:PORT][/PATH][?protocol=P&group=G] (an internet password), \
            and in --env also plain SERVICE/ACCOUNT. Parts are %-decoded (%2F is a / inside a part).

            Example: coffer run --env GITHUB_TOKEN=github/me -- gh repo list
            """)
    @OptionGroup var connect: Connect
    @OptionGroup var auth: AuthenticationArguments
    @Option(name: .customLong("env"), help: ArgumentHelp("A variable to set: NAME=REFERENCE (repeatable).", valueName: "NAME=REFERENCE"))
    var assignments: [String] = []
    @Flag(name: .customLong("no-inherited-references"), help: "Leave inherited variables whose value looks like a reference alone.")
    var noInheritedReferences = false
    @Argument(parsing: .postTerminator, help: ArgumentHelp("The command and its arguments, after --.", valueName: "command"))
    var command: [String] = []

    /// The variables to set: --env first, then references found in the inherited environment.
    func variables() throws -> [(name: String, reference: SecretReference)] {
        var out: [(name: String, reference: SecretReference)] = []
        for a in assignments {
            guard let eq = a.firstIndex(of: "=") else { throw ValidationError("--env needs NAME=REFERENCE, got '\(Output.escapedText(a))'") }
            let name = String(a[..<eq])
            guard SecretFormat.isVariableName(name) else { throw ValidationError("--env: '\(Output.escapedText(name))' is not a variable name") }
            guard !out.contains(where: { $0.name == name }) else { throw ValidationError("--env: \(name) is given twice") }
            do { out.append((name, try SecretReference(parsing: String(a[a.index(after: eq)...]), allowBare: true))) } catch {
                throw ValidationError("--env \(name): \(error.description)")
            }
        }
        guard !noInheritedReferences else { return out }
        for (name, value) in Self.inheritedEnvironment() where SecretReference.looksLikeReference(value) && !out.contains(where: { $0.name == name }) {
            do { out.append((name, try SecretReference(parsing: value))) } catch {
                throw ValidationError("inherited variable \(name): \(error.description) (or pass --no-inherited-references)")
            }
        }
        return out
    }

    func validate() throws {
        guard !command.isEmpty else { throw ValidationError("give the command to run after --") }
        _ = try variables()
    }

    func run() throws {
        let variables = try variables()
        var execError: Int32? = nil
        let status = CLISupport.reporting { () throws(SecError) in
            let c = try connect.open()
            try auth.apply(to: c)
            let secrets = try resolve(variables.map(\.reference), on: c)
            var entries: [SecureBytes] = []
            for (v, secret) in zip(variables, secrets) {
                do { entries.append(try SecretFormat.environmentEntry(name: v.name, secret: secret)) } catch {
                    throw .param("\(v.name): the secret contains a NUL byte, which an environment variable cannot hold")
                }
                secret.wipe()
            }

            let e = Self.exec(command, keeping: Self.inheritedEntries(except: Set(variables.map(\.name))), secrets: entries)
            execError = e
            StandardStreams.printError(CLISupport.messagePrefix + "cannot run \(Output.escapedText(command[0])): \(String(cString: strerror(e)))")
        }
        // As env(1) and the shells: 127 when the command is not found, 126 when it cannot be run.
        if let execError { throw ExitCode(execError == ENOENT ? 127 : 126) }
        throw ExitCode(status)
    }

    /// This process's environment as name/value pairs, in order.
    static func inheritedEnvironment() -> [(name: String, value: String)] {
        var out: [(name: String, value: String)] = []
        var p = environ
        while let entry = p.pointee {
            let s = String(cString: entry)
            if let eq = s.firstIndex(of: "=") { out.append((String(s[..<eq]), String(s[s.index(after: eq)...]))) }
            p += 1
        }
        return out
    }

    /// This process's own `NAME=value` entries, byte for byte (a value that is not UTF-8 reaches the
    /// command unchanged), but for those named in `replaced`.
    static func inheritedEntries(except replaced: Set<String>) -> [UnsafeMutablePointer<CChar>] {
        var out: [UnsafeMutablePointer<CChar>] = []
        var p = environ
        while let entry = p.pointee {
            p += 1
            guard let eq = strchr(entry, Int32(UInt8(ascii: "="))) else { continue }
            let name = String(decoding: UnsafeRawBufferPointer(start: entry, count: eq - entry), as: UTF8.self)
            if !replaced.contains(name) { out.append(entry) }
        }
        return out
    }

    /// execvpe with `kept` (this process's own entries) and the secret entries (NUL-terminated, read
    /// in place from secure memory); returns errno if it fails.
    static func exec(_ command: [String], keeping kept: [UnsafeMutablePointer<CChar>], secrets: [SecureBytes]) -> Int32 {
        func withSecretPointers(_ index: Int, _ collected: [UnsafePointer<CChar>], _ body: ([UnsafePointer<CChar>]) -> Int32) -> Int32 {
            guard index < secrets.count else { return body(collected) }
            return secrets[index].withUnsafeBytes { raw in
                withSecretPointers(index + 1, collected + [raw.baseAddress!.assumingMemoryBound(to: CChar.self)], body)
            }
        }
        let argv = command.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        return withSecretPointers(0, []) { secretPointers in
            var envp: [UnsafeMutablePointer<CChar>?] = kept.map { Optional($0) } + secretPointers.map { UnsafeMutablePointer(mutating: $0) } + [nil]
            var args = argv
            // execvpe's PATH search (the Glibc module does not export it): a name with a slash as is,
            // else each PATH entry in turn; the first error other than "not there" is the one reported.
            let name = command[0]
            guard !name.utf8.contains(UInt8(ascii: "/")) else { execve(name, &args, &envp); return errno }
            let path = inheritedEnvironment().first { $0.name == "PATH" }?.value ?? "/usr/local/bin:/usr/bin:/bin"
            var firstError: Int32 = ENOENT
            for dir in path.split(separator: ":", omittingEmptySubsequences: false) {
                let candidate = (dir.isEmpty ? "." : String(dir)) + "/" + name
                execve(candidate, &args, &envp)
                let e = errno
                if e != ENOENT && e != ENOTDIR && firstError == ENOENT { firstError = e }
            }
            return firstError
        }
    }
}

struct Inject: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Fill a template's {{ coffer://… }} references with secrets.",
        discussion: """
            Reads a template on standard input and writes it with every {{ REFERENCE }} replaced by that \
            item's secret, to standard output or --output. References are looked up first: if any names no \
            item, is malformed, or is refused, nothing is written and coffer exits non-zero. A {{ … }} that \
            starts like a reference scheme (coffer: or coffer-inet:, in any case) but does not parse is an \
            error, so a typo never passes through; any other {{ … }} is left as it is.

            References: coffer://SERVICE[/ACCOUNT][?group=G], \
            coffer-inet://[ACCOUNT@]SERVER[:PORT][/PATH][?protocol=P&group=G]; parts are %-decoded.

            Example: coffer inject --output app.conf < app.conf.tmpl
            """)
    @OptionGroup var connect: Connect
    @OptionGroup var auth: AuthenticationArguments
    @Option(name: .customLong("output"), help: ArgumentHelp("Write here (created 0600, replaced atomically) instead of standard output.", valueName: "file"))
    var output: String?

    /// The largest template read (templates are configuration files, not data).
    static let maximumTemplateBytes = 4 << 20

    func run() throws {
        try reporting { () throws(SecError) in
            let template = try Self.readTemplate()
            let parsed: SecretTemplate
            do { parsed = try SecretTemplate(parsing: template) } catch let e as SecretReference.ParseError { throw .param("template: \(e.description)") } catch { throw .param("template: unreadable") }
            let references = parsed.references
            var secrets: [SecureBytes] = []
            if !references.isEmpty {
                let c = try connect.open()
                try auth.apply(to: c)
                secrets = try resolve(references, on: c)
            }
            defer { secrets.forEach { $0.wipe() } }
            var total = 0
            for piece in parsed.pieces {
                switch piece {
                case .literal(let r): total += r.count
                case .reference(let ref): total += secrets[references.firstIndex(of: ref)!].count
                }
            }
            let out = SecureBytes(count: total)
            defer { out.wipe() }
            out.withUnsafeMutableBytes { o in
                var n = 0
                for piece in parsed.pieces {
                    switch piece {
                    case .literal(let r):
                        for b in template[r] { o[n] = b; n += 1 }
                    case .reference(let ref):
                        secrets[references.firstIndex(of: ref)!].withUnsafeBytes { s in
                            for b in s { o[n] = b; n += 1 }
                        }
                    }
                }
            }
            if let output {
                do {
                    try out.withUnsafeBytes { (b: UnsafeRawBufferPointer) throws(SystemError) in try Files.writeAtomically(output, bytes: b, mode: 0o600, temporary: .unique) }
                } catch { throw .io("cannot write \(Output.escapedText(output)): \(error)") }
            } else {
                guard out.withUnsafeBytes({ Output.write(1, $0) }) else { throw .io("cannot write to standard output") }
            }
        }
    }

    static func readTemplate() throws(SecError) -> [UInt8] {
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(0, $0.baseAddress, $0.count) }
            if n < 0 { if errno == EINTR { continue }; throw .io("cannot read the template from standard input") }
            if n == 0 { return bytes }
            bytes += chunk[0..<n]
            if bytes.count > maximumTemplateBytes { throw .param("the template is larger than \(maximumTemplateBytes >> 20) MiB") }
        }
    }
}
