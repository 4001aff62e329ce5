import ArgumentParser
import CofferClient
import CofferModel

/// `coffer check`: verifies every item the agent can open, reports each damaged one by persistent
/// reference and reason, and quarantines (never deletes) those failing authentication.
struct Check: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Verify every item; quarantine or restore damaged ones.",
        discussion: """
            Verifies every item whose keys are in memory (unlock first to check them all): its attributes and \
            secret authenticate, its class and protection match its row, it has an access group, and its index \
            entries match its attributes. Each failure prints as 'REFERENCE REASON: DETAIL' (reference in hex; \
            reasons: authentication, index, group, class) and the command exits 8 (errSecDecode). --quarantine \
            moves the items failing authentication into the quarantine table, so listings no longer meet them; \
            nothing is deleted: --list-quarantine shows them and --restore REFERENCE puts one back.
            """)
    @OptionGroup var connect: Connect
    @Flag(help: "Move items that fail authentication into the quarantine table.") var quarantine = false
    @Flag(name: .customLong("list-quarantine"), help: "List the quarantined items.") var listQuarantine = false
    @Option(help: "Put the quarantined item with this persistent reference (32 hex digits) back.") var restore: String?
    @Flag(help: "Print JSON.") var json = false

    func validate() throws {
        guard [quarantine, listQuarantine, restore != nil].filter({ $0 }).count <= 1 else {
            throw ValidationError("--quarantine, --list-quarantine and --restore do not go together")
        }
        if let restore, Hex.decode(restore)?.count != 16 { throw ValidationError("--restore takes a persistent reference: 32 hex digits") }
    }

    func run() throws {
        let operation: CheckOperation = quarantine ? .quarantine : listQuarantine ? .listQuarantine
            : restore.flatMap(Hex.decode).map { .restore(persistentRef: $0) } ?? .verify
        try reporting { () throws(SecError) in
            let agent = try connect.open()
            let report: CheckReport
            if case .restore = operation {
                report = try agent.check(operation)
            } else {
                do throws(SecError) {
                    report = try agent.checkAll(operation)   // paged: any number of findings
                } catch where error.status == .param {
                    report = try agent.check(operation)      // an agent from before CHECK_PAGE
                }
            }
            if json {
                let findings = report.findings.map {
                    "{\"persistentRef\":\"\(Hex.encode($0.persistentRef))\",\"reason\":\"\($0.reason.name)\",\"quarantined\":\($0.quarantined),"
                        + "\"detail\":\(Output.json($0.detail))}"
                }
                Output.print("{\"checked\":\(report.checked),\"skipped\":\(report.skipped),\"findings\":[\(findings.joined(separator: ","))]}")
            } else {
                for f in report.findings {
                    Output.print("\(Hex.encode(f.persistentRef)) \(f.reason.name)\(f.quarantined && operation != .listQuarantine ? " (quarantined)" : ""): "
                        + Output.escapedText(f.detail))
                }
                switch operation {
                case .verify, .quarantine:
                    Output.printError("coffer: \(report.checked) item\(report.checked == 1 ? "" : "s") checked, \(report.findings.count) damaged"
                        + (report.skipped > 0 ? ", \(report.skipped) not checked (locked: run 'coffer unlock' first)" : ""))
                    if operation == .verify && report.findings.contains(where: { $0.reason == .authentication || $0.reason == .itemClass }) {
                        Output.printError("coffer: hint: 'coffer check --quarantine' moves the items that cannot be opened aside (restorable)")
                    }
                case .listQuarantine:
                    Output.printError("coffer: \(report.findings.count) quarantined item\(report.findings.count == 1 ? "" : "s")")
                case .restore:
                    Output.printError("coffer: restored 1 item")
                }
            }
            if operation == .verify && !report.findings.isEmpty {
                throw SecError(.decode, "\(report.findings.count) damaged item\(report.findings.count == 1 ? "" : "s") (see above)")
            }
        }
    }
}

/// A listing that goes on past items failing authentication and warns about them on stderr, with
/// the command that reports them (`coffer find`).
func listingPastUnreadable(_ c: AgentConnection, _ q: ItemQuery) throws(SecError) -> [ItemResult] {
    let (items, unreadable) = try c.copyMatchingSkippingUnreadable(q)
    if unreadable > 0 {
        Output.printError("coffer: warning: \(unreadable) item\(unreadable == 1 ? "" : "s") could not be read (failed authentication); "
            + "run 'coffer check' for details")
    }
    return items
}
