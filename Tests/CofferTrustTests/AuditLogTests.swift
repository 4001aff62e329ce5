import CofferAudit
import CofferModel
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

@Suite struct AuditLogTests {
    static func record(_ i: Int, time: Double = 1_763_928_609.123, exe: String? = "/usr/bin/app", result: Int32 = 0) -> AuditRecord {
        AuditRecord(time: time, pid: Int32(1000 + i), app: "com.example.app", executable: exe, operation: "get",
                    accessGroup: "group-\(i)", itemClass: .genericPassword, result: result)
    }

    @Test func appendWritesOneJSONLinePerRecordInAPrivateFile() throws {
        let dir = TemporaryDirectory()
        let log = AuditLog(directory: dir.path)
        try log.append(Self.record(1))
        try log.append(Self.record(2, exe: "/tmp/evil\n{\"x\":1}\u{1b}[31m\"", result: -34018))
        #expect(Files.mode(log.path) == 0o600)
        let text = String(decoding: fileBytes(log.path), as: UTF8.self)
        #expect(text.split(separator: "\n").count == 2 && text.hasSuffix("\n"))
        #expect(text.hasPrefix("{\"time\":1763928609.123,\"pid\":1001,\"app\":\"com.example.app\",\"executable\":\"/usr/bin/app\","
            + "\"operation\":\"get\",\"accessGroup\":\"group-1\",\"class\":\"genp\",\"result\":0}\n"))
        #expect(!text.contains("\u{1b}"))
        let (records, skipped) = AuditReader.read(directory: dir.path)
        #expect(skipped == 0)
        #expect(records == [Self.record(1), Self.record(2, exe: "/tmp/evil\n{\"x\":1}\u{1b}[31m\"", result: -34018)])
    }

    /// The record type is the whole schema: nothing in it can hold a secret or an attribute value.
    @Test func theSchemaHasNoPlaceForASecretOrAttributeValue() throws {
        let r = Self.record(1)
        let labels = Mirror(reflecting: r).children.compactMap(\.label)
        #expect(labels == ["time", "pid", "app", "executable", "operation", "accessGroup", "itemClass", "result", "key", "destination", "reason"])
        let line = r.jsonLine()
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(Set(object.keys) == Set(AuditRecord.fieldNames).subtracting(AuditRecord.optionalFieldNames), "written only when set")
        let signature = AuditRecord(time: 1, pid: 1, app: nil, executable: "/usr/bin/ssh", operation: "ssh-sign", accessGroup: nil,
                                    itemClass: nil, result: -128, key: "SHA256:abc", destination: "host\n\u{1b}", reason: "cancelled")
        let full = try #require(try JSONSerialization.jsonObject(with: Data(signature.jsonLine().utf8)) as? [String: Any])
        #expect(Set(full.keys) == Set(AuditRecord.fieldNames))
        #expect(!signature.jsonLine().dropLast().contains("\n") && !signature.jsonLine().contains("\u{1b}"), "a value ended the line")
        let plain = AuditRecord(time: 1, pid: 1, app: nil, executable: "/usr/bin/ssh", operation: "ssh-sign", accessGroup: nil,
                                itemClass: nil, result: 0, key: "SHA256:abc", destination: "server.example", reason: "confirmed")
        #expect(AuditRecord(jsonLine: String(plain.jsonLine().dropLast())) == plain, "read back (the reader splits at the LF)")
        #expect(AuditRecord.fieldNames.count == labels.count)
        // What a caller might be tempted to log: a secret and attribute values. No argument takes them,
        // so they are nowhere in the file after a full append.
        let dir = TemporaryDirectory()
        let log = AuditLog(directory: dir.path)
        let secret = "hunter2-SECRET-\(UUID().uuidString)", account = "alice-ACCOUNT-VALUE"
        _ = (secret, account)
        try log.append(r)
        let text = String(decoding: fileBytes(log.path), as: UTF8.self)
        #expect(!text.contains(secret) && !text.contains(account))
    }

    @Test func rotatesBySizeAndKeepsThreeOldFiles() throws {
        let dir = TemporaryDirectory()
        let lineBytes = Self.record(0).jsonLine().utf8.count
        let log = AuditLog(directory: dir.path, maximumBytes: lineBytes * 10, keep: 3)
        for i in 0..<100 { try log.append(Self.record(i % 10, time: 1_700_000_000 + Double(i))) }
        let files = AuditLog.files(in: dir.path)
        #expect(files == ["3", "2", "1"].map { log.path + "." + $0 } + [log.path])
        #expect(access(log.path + ".4", F_OK) != 0)
        for f in files { #expect(fileBytes(f).count <= lineBytes * 10, "\(f)") }
        let (records, skipped) = AuditReader.read(directory: dir.path)
        #expect(skipped == 0)
        // The newest 40 records survive, oldest first.
        #expect(records.map(\.time) == (60..<100).map { 1_700_000_000 + Double($0) })
        for f in files { #expect(Files.mode(f) == 0o600) }
    }

    @Test func aTornLastLineSpoilsOnlyItself() throws {
        let dir = TemporaryDirectory()
        let path = dir.file(AuditLog.fileName)
        let whole = Self.record(1).jsonLine()
        try (whole + String(whole.prefix(20))).write(toFile: path, atomically: false, encoding: .utf8)
        let log = AuditLog(directory: dir.path)
        try log.append(Self.record(2))
        let (records, skipped) = AuditReader.read(directory: dir.path)
        #expect(records == [Self.record(1), Self.record(2)])
        #expect(skipped == 1)
    }

    @Test func readerFiltersBySince() throws {
        let dir = TemporaryDirectory()
        let log = AuditLog(directory: dir.path)
        for i in 0..<5 { try log.append(Self.record(i, time: 1000 + Double(i))) }
        #expect(AuditReader.read(directory: dir.path, since: 1003).records.map(\.pid) == [1003, 1004])
    }

    @Test func linesThatAreNotRecordsAreRejected() {
        for bad in ["", "{}", "[]", "{\"time\":1}", "{\"time\":\"x\",\"pid\":1,\"operation\":\"get\",\"result\":0}",
                    "{\"time\":1,\"pid\":1,\"operation\":\"get\",\"result\":0,\"class\":\"nope\"}",
                    "{\"time\":1,\"pid\":1,\"operation\":\"get\",\"result\":0} trailing",
                    "{\"time\":1,\"pid\":1,\"pid\":2,\"operation\":\"get\",\"result\":0}"] {
            #expect(AuditRecord(jsonLine: bad) == nil, "\(bad)")
        }
        #expect(AuditRecord(jsonLine: "{\"time\":1,\"pid\":1,\"operation\":\"g\\u00e9t\",\"result\":0}")?.operation == "gét")
    }
}
