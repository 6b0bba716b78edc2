"""Statistical helpers for distribution tests (significance level 0.001)."""
import torch

# chi-square critical values at significance 0.001, df 1..20 (standard tables)
_CHI2_999 = [10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59, 31.26, 32.91, 34.53,
             36.12, 37.70, 39.25, 40.79, 42.31, 43.82, 45.31]


def chi2_critical(df: int) -> float:
    """Critical value at 0.001; Wilson-Hilferty approximation beyond the table (z = 3.090)."""
    if df <= len(_CHI2_999):
        return _CHI2_999[df - 1]
    z, a = 3.090, 2.0 / (9 * df)
    return df * (1 - a + z * a ** 0.5) ** 3


def chi_square(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0):
    """Pearson statistic with rare categories pooled into one bin; returns (stat, df)."""
    counts, probs = counts.double(), probs.double()
    expected = probs * counts.sum()
    keep = expected >= min_expected
    obs = torch.cat([counts[keep], counts[~keep].sum(0, keepdim=True)])
    exp = torch.cat([expected[keep], expected[~keep].sum(0, keepdim=True)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    return float(((obs - exp) ** 2 / exp).sum()), len(exp) - 1


def assert_matches(counts: torch.Tensor, probs: torch.Tensor, what: str = "", min_df: int = 1):
    stat, df = chi_square(counts, probs)
    assert df >= min_df, f"{what}: only {df} degrees of freedom"
    assert stat < chi2_critical(df), f"{what}: chi-square {stat:.1f} >= {chi2_critical(df):.1f} (df {df})"
