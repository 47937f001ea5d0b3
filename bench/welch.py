"""The difference of two samples' means with a 95% interval by Welch's t (unequal variances), for the A / B scripts
(bench/ab_model.py: tokens/s of alternated runs; bench/ktrace/ab.py: a step's GPU times from alternated traces)."""
import math
import statistics

# Two-sided 97.5% quantiles of Student's t for 1..30 degrees of freedom (beyond: 1.96).
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def interval(a, b):
    """(mean b - mean a, half-width of its 95% interval) for samples a and b of at least two values each."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("welch: each sample needs at least two values")
    sa, sb = statistics.stdev(a), statistics.stdev(b)
    na, nb = len(a), len(b)
    se = math.sqrt(sa * sa / na + sb * sb / nb)
    # Welch-Satterthwaite degrees of freedom.
    df = se ** 4 / ((sa * sa / na) ** 2 / (na - 1) + (sb * sb / nb) ** 2 / (nb - 1)) if se > 0 else float(na + nb - 2)
    t = 1.96 if df > len(T975) else T975[max(1, int(df)) - 1]
    return statistics.mean(b) - statistics.mean(a), t * se
