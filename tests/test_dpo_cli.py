"""jaxppo.cli.dpo.format_summary: the console lines of a DPO-family run's summary, by hand."""

from jaxppo.cli.dpo import format_summary

SUMMARY = {"eval/rewards/accuracies": 0.5663, "eval/rewards/accuracies_ci95": [0.512, 0.6213], "n_heldout_pairs": 166,
           "eval/rewards/margins": -0.0028, "train/rewards/accuracies": 0.5798, "time/total_s": 63.8}


def test_pairs_and_unpaired_rows_are_named_as_what_they_are():
    paired = format_summary(SUMMARY).splitlines()
    assert paired == ["held-out pair accuracy (implicit reward) 0.5663 95% CI [0.5120, 0.6213] on 166 pairs; "
                      "margin -0.0028; training pairs 0.5798", "time 63.8s"]
    kto = format_summary(SUMMARY, unpaired=True).splitlines()[0]
    assert kto == ("held-out label accuracy (implicit reward on the label's side of z0) 0.5663 95% CI [0.5120, "
                   "0.6213] on 166 rows; margin -0.0028; training rows 0.5798")


def test_the_held_out_reward_line_when_evaluated():
    s = dict(SUMMARY, **{"eval/reward_before": 0.1, "eval/reward_after": 0.25, "eval/reward_gain_ci95": [0.05, 0.25],
                         "eval/kl": 0.3})
    assert format_summary(s).splitlines()[1] == ("held-out reward 0.1000 -> 0.2500 (gain 95% CI [+0.0500, +0.2500]), "
                                                 "KL(policy||ref) 0.3000")
