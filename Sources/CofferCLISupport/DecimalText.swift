/// Numbers as text without Foundation, for the tables `coffer-bench` prints: a fixed number of
/// decimals with the sign in front of the whole number (`-5.4`, never `-5.-4`), and thousands grouped.
package enum DecimalText {
    /// `x` rounded half away from zero to `digits` decimals (0 to 9): `fixed(-5.44, 1)` is `-5.4`,
    /// `fixed(-0.04, 1)` is `0.0` (no sign on a value that rounds to zero), `fixed(2, 2)` is `2.00`.
    /// A value that is not finite, or too large for an Int at that scale, is written as Swift writes it.
    package static func fixed(_ x: Double, _ digits: Int) -> String {
        let digits = min(max(digits, 0), 9)
        var scale = 1
        for _ in 0..<digits { scale *= 10 }
        let scaled = (abs(x) * Double(scale)).rounded()
        guard scaled.isFinite, scaled < 9.0e18 else { return "\(x)" }
        let v = Int(scaled)
        var text = String(v / scale)
        if digits > 0 {
            let frac = String(v % scale)
            text += "." + String(repeating: "0", count: digits - frac.count) + frac
        }
        return (x < 0 && v > 0 ? "-" : "") + text
    }

    /// `n` with a comma between each group of three digits: `1234567` is `1,234,567`, `-1234` is `-1,234`.
    package static func grouped(_ n: Int) -> String {
        let digits = Array(String(n.magnitude))
        var out = n < 0 ? "-" : ""
        for (i, d) in digits.enumerated() {
            if i > 0 && (digits.count - i) % 3 == 0 { out.append(",") }
            out.append(d)
        }
        return out
    }
}
