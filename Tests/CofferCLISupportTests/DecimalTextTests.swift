@testable import CofferCLISupport
import Testing

/// The numbers `coffer-bench` prints (issue #41: `coffer-bench tpm` printed a TPM − file difference
/// of −5.4 ms as `-5.-4`).
@Suite struct DecimalTextTests {
    @Test(arguments: [
        (-5.4, 1, "-5.4"), (-5.44, 1, "-5.4"), (-5.46, 1, "-5.5"), (-0.4, 1, "-0.4"), (-0.04, 1, "0.0"), (0, 1, "0.0"),
        (125.1, 1, "125.1"), (4.5, 1, "4.5"), (0.99, 2, "0.99"), (1.05, 2, "1.05"), (-1.5, 0, "-2"), (2, 2, "2.00"),
        (7298, 0, "7298"), (-12.3456, 3, "-12.346"), (0.001, 3, "0.001"), (-0.001, 3, "-0.001"),
    ] as [(Double, Int, String)])
    func fixedPutsTheSignBeforeTheWholeNumber(_ x: Double, _ digits: Int, _ expected: String) {
        #expect(DecimalText.fixed(x, digits) == expected, "\(x) with \(digits) decimals")
    }

    @Test func valuesOutsideAnIntAreWrittenAsSwiftWritesThem() {
        #expect(DecimalText.fixed(.infinity, 1) == "inf")
        #expect(DecimalText.fixed(-.infinity, 1) == "-inf")
        #expect(DecimalText.fixed(.nan, 1) == "nan")
        #expect(DecimalText.fixed(1e300, 1) == "1e+300")
    }

    @Test(arguments: [(0, "0"), (999, "999"), (1000, "1,000"), (100_000, "100,000"), (1_234_567, "1,234,567"), (-1234, "-1,234"),
                      (-999, "-999"), (Int.min, "-9,223,372,036,854,775,808")] as [(Int, String)])
    func groupedPutsACommaEveryThreeDigits(_ n: Int, _ expected: String) {
        #expect(DecimalText.grouped(n) == expected)
    }
}
