@testable import CofferAgent
@testable import CofferNativeFrontEnd
import CofferKeychain
import CofferModel
import CofferPluginClient
import CofferProtocol
import CofferService
import CofferServiceTestSupport
import CofferSystem
import CofferTestSupport
import Foundation
import Logging
import Testing

/// Issue #25 part 4: authentication is one stage. The keychain answers "authentication needed" with
/// the rules every match needs (no search for them), and a round reads the biometric sensor once.
@Suite struct AuthenticationStageTests {
    typealias T = AuthenticationTests

    /// Issue #42: one search, the attempt's; the read once the person authenticated opens its matches.
    @Test func aProtectedReadSearchesOnceAndReadsTheSensorOnce() throws {
        var (rig, s) = try T.ready()
        #expect(errorStatus(rig.pipeline.handle(T.add("biometry-any"), session: &s)) == nil)
        rig.sensor.queue(.match())
        let (searches, reads, trips) = (rig.keychain.searchCount, rig.sensor.stateReads, rig.sensor.roundTrips)
        #expect(T.secretText(rig.pipeline.handle(T.get(), session: &s, channel: ScriptedChannel([.waitForStop]))) == "pin 1234")
        #expect(rig.keychain.searchCount - searches == 1, "the attempt (which names the rules and the matches); the read opens them")
        #expect(rig.sensor.stateReads - reads == 1, "one STATE per authentication round")
        #expect(rig.sensor.roundTrips - trips == 2, "STATE and EVALUATE")
    }

    @Test func anUpdateOrDeleteOfSeveralProtectedItemsAsksOnceForAllTheirRules() throws {
        var (rig, s) = try T.ready()
        #expect(errorStatus(rig.pipeline.handle(T.add("user-presence", service: "a"), session: &s)) == nil)
        let appPassword = AgentRequest.add(NewItem(itemClass: .genericPassword,
                                                   attributes: ["svce": .string("b"), "acct": .string("me"),
                                                                AccessControl.attributeName: .data(AccessControl(parsing: "application-password")!.encoded())],
                                                   secret: secret("pin 5678")), [])
        let adding = ScriptedChannel([.answer(.applicationPassword(secret("apw")))])
        #expect(errorStatus(rig.pipeline.handle(appPassword, session: &s, channel: adding)) == nil)
        // Both items in one delete: the keychain's answer names both rules, so the person is asked
        // for the passcode (user presence) and the application password, and the items go.
        let searches = rig.keychain.searchCount
        let everything = ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("me")])
        let client = ScriptedChannel([.answer(T.passcode), .answer(.applicationPassword(secret("apw")))])
        let r = rig.pipeline.handle(.delete(everything), session: &s, channel: client)
        guard case .count(2) = r else { Issue.record("\(r)"); return }
        #expect(client.asked.count == 2)
        #expect(rig.keychain.searchCount - searches == 2)
    }

    @Test func theKeychainsAnswerCarriesTheRulesOfEveryMatch() throws {
        var (rig, s) = try T.ready()
        #expect(errorStatus(rig.pipeline.handle(T.add("user-presence", service: "a"), session: &s)) == nil)
        #expect(errorStatus(rig.pipeline.handle(T.add("biometry-any", service: "b"), session: &s)) == nil)
        let all = ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("me")], limit: .all, returnData: true)
        do {
            _ = try rig.keychain.copyMatching(all, scope: .unrestricted)
            Issue.record("read protected items without authentication")
        } catch {
            #expect(error.needsAuthentication && error.status == .interactionNotAllowed)
            #expect(error.accessRequirements == [AccessControl(parsing: "user-presence")!, AccessControl(parsing: "biometry-any")!])
        }
    }

    /// The real plugin host with the Test plugin as the sensor (it answers at once): a protected
    /// read costs one STATE and one EVALUATE.
    @Test(.enabled(if: HostBinaries.available, "needs the built coffer-plugin-host and libCofferPluginTest.so"))
    func aProtectedReadThroughThePluginHostCostsTwoRoundTrips() throws {
        let dir = TemporaryDirectory("coffer-stage-plugins")
        let plugins = dir.file("plugins")
        #expect(mkdir(plugins, 0o755) == 0 && mkdir(dir.file("state"), 0o700) == 0)
        try FileManager.default.copyItem(atPath: HostBinaries.directory + "/libCofferPluginTest.so", toPath: plugins + "/test.so")
        chmod(plugins + "/test.so", 0o644)
        let host = try PluginHost(PluginHost.Configuration(executable: HostBinaries.directory + "/coffer-plugin-host",
                                                            pluginDirectories: [plugins], stateDirectory: dir.file("state")))
        defer { host.shutdown() }
        let sensor = PluginBiometricSensor(host: host, plugin: "test", logger: .init(label: "test"))
        #expect(try sensor.control("enroll", ["finger"]).code == 0)
        let rig = try AgentRig(realSensor: sensor)
        var s = rig.greetedSession(as: rig.signedCaller("com.example.bank", ["bank"]))
        #expect(errorStatus(rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &s)) == nil)
        #expect(errorStatus(rig.pipeline.handle(T.add("biometry-current-set"), session: &s)) == nil)
        let (searches, trips) = (rig.keychain.searchCount, host.roundTrips)
        // The Test plugin sends a feedback line before its result: a first wake may be that alone.
        #expect(T.secretText(rig.pipeline.handle(T.get(), session: &s, channel: ScriptedChannel([.waitForStop, .waitForStop]))) == "pin 1234")
        #expect(rig.keychain.searchCount - searches == 1, "the attempt; the read opens its matches")
        #expect(host.roundTrips - trips == 2, "one STATE and one EVALUATE (whose RESULT carries the domain state)")
    }
}

/// Where `swift build` put the plugin host and the Test plugin (beside this test runner).
enum HostBinaries {
    static let directory: String = {
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? ""
        let beside = URL(fileURLWithPath: exe).deletingLastPathComponent().path
        if FileManager.default.isExecutableFile(atPath: beside + "/coffer-plugin-host") { return beside }
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return root.appendingPathComponent(".build/debug").path
    }()
    static var available: Bool {
        FileManager.default.isExecutableFile(atPath: directory + "/coffer-plugin-host")
            && FileManager.default.fileExists(atPath: directory + "/libCofferPluginTest.so")
    }
}
