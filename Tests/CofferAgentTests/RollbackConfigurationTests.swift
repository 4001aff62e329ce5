@testable import CofferAgent
import Testing

/// The rollback-detection keys of cofferd.conf (cofferd(8)): off by default, each value checked, a bad
/// one refused with the file and line.
@Suite struct RollbackConfigurationTests {
    func configuration(_ text: String) throws -> AgentConfiguration {
        var c = AgentConfiguration(socketPath: "/x", stateDirectory: "/y", userName: "u")
        try c.apply(configFile: text, name: "cofferd.conf")
        return c
    }

    @Test func detectionIsOffUnlessTurnedOn() throws {
        let c = try configuration("")
        #expect(!c.rollbackDetection)
        #expect(c.rollbackTCTI == "device:/dev/tpmrm0" && c.rollbackNVIndex == 0x0100_C0FF && c.rollbackInterval == 60)
        let on = try configuration("rollback-detection = on\nrollback-tcti = swtpm:host=127.0.0.1,port=2321\nrollback-nv-index = 0x0100C0F0\nrollback-interval = 5\n")
        #expect(on.rollbackDetection && on.rollbackTCTI == "swtpm:host=127.0.0.1,port=2321")
        #expect(on.rollbackNVIndex == 0x0100_C0F0 && on.rollbackInterval == 5)
        #expect(try !configuration("rollback-detection = on\nrollback-detection = off\n").rollbackDetection)
    }

    @Test func theCounterIsOnTheDeviceKeysTPMUnlessSetApart() throws {
        let same = try configuration("device-key = tpm\ntpm-tcti = swtpm:host=127.0.0.1,port=2400\nrollback-detection = on\n")
        #expect(same.rollbackTCTI == "swtpm:host=127.0.0.1,port=2400", "one TPM setting serves both")
        let apart = try configuration("rollback-tcti = swtpm:host=127.0.0.1,port=2500\ntpm-tcti = swtpm:host=127.0.0.1,port=2400\n")
        #expect(apart.rollbackTCTI == "swtpm:host=127.0.0.1,port=2500" && apart.tpmTCTI == "swtpm:host=127.0.0.1,port=2400")
    }

    @Test func badValuesAreRefusedWithTheirLine() {
        for bad in ["rollback-detection = yes", "rollback-tcti =", "rollback-nv-index = 0x8100C0FF", "rollback-nv-index = zz",
                    "rollback-interval = 0", "rollback-interval = -1"] {
            do {
                _ = try configuration("\n" + bad + "\n")
                Issue.record("\(bad) was accepted")
            } catch {
                #expect("\(error)".contains("cofferd.conf:2"), "\(bad): \(error)")
            }
        }
    }
}

/// The agent's configuration file (issue #43): found without `--config` at the XDG place, and an
/// unknown key is an error naming the file, the line and the nearest key.
@Suite struct ConfigurationFileTests {
    @Test func theDefaultFileIsTheXDGOne() {
        #expect(AgentConfiguration.defaultConfigPath(environment: ["XDG_CONFIG_HOME": "/x/conf"], home: "/home/u") == "/x/conf/coffer/cofferd.conf")
        #expect(AgentConfiguration.defaultConfigPath(environment: [:], home: "/home/u") == "/home/u/.config/coffer/cofferd.conf")
        // A relative XDG_CONFIG_HOME is invalid (the XDG rule): the home one is used.
        #expect(AgentConfiguration.defaultConfigPath(environment: ["XDG_CONFIG_HOME": "rel"], home: "/home/u") == "/home/u/.config/coffer/cofferd.conf")
    }

    @Test func anUnknownKeyNamesTheFileTheLineAndTheNearestKey() throws {
        var cfg = AgentConfiguration(socketPath: "/s", stateDirectory: "/d", userName: "u")
        do {
            try cfg.apply(configFile: "idle-lock = 60\n# comment\nidle-lok = 5\n", name: "/etc/x.conf")
            Issue.record("an unknown key was accepted")
        } catch {
            #expect(error.description.contains("/etc/x.conf:3: unknown key 'idle-lok'; did you mean 'idle-lock'?"), "\(error)")
        }
        do {
            try cfg.apply(configFile: "zzzzzzzz = 1\n", name: "f")
            Issue.record("an unknown key was accepted")
        } catch {
            #expect(error.description.contains("f:1: unknown key 'zzzzzzzz' (the keys are in cofferd(8))"), "\(error)")
        }
        // Every key the parser takes is in the list the hint draws from, and the other way round.
        for key in AgentConfiguration.configurationKeys {
            var c = AgentConfiguration(socketPath: "/s", stateDirectory: "/d", userName: "u")
            do { try c.apply(configFile: "\(key) = ?\n", name: "f") } catch {
                #expect(!error.description.contains("unknown key"), "\(key): \(error)")
            }
        }
    }
}
