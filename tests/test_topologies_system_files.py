"""User system files: a custom fabric described in YAML works; bad files fail with one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from topologies.hardware import SYSTEMS_DIR, load_system
from topologies.inputs import UserInputError

BASE = yaml.safe_load((SYSTEMS_DIR / "gb300-nvl72.yaml").read_text())


def _write(tmp_path: Path, name: str, data: dict | str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(path)


def _variant(**changes) -> dict:
    data = json.loads(json.dumps(BASE))
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node[key]
        if value is None:
            node.pop(leaf)
        else:
            node[leaf] = value
    return data


def test_a_user_describes_their_own_rack_links_tiers_and_oversubscription(tmp_path, run_cli):
    custom = _variant(**{
        "name": "my-nvl32", "nvlink.domain_size": 32, "nvlink.link_bandwidth_Bps": 40e9,
        "nvlink.switch_chips": 8, "scale_out.switch_radix": 64, "scale_out.rails": 4,
        "scale_out.tiers": 3, "scale_out.oversubscription": 2.0, "scale_out.planes": 2,
        "scale_out.domains_per_scalable_unit": 4,
    })
    path = _write(tmp_path, "my", custom)
    system = load_system(path)
    assert system.nvlink.gpu_bandwidth_Bps == pytest.approx(18 * 40e9)
    result = run_cli("topology", "--system", path, "--gpus", "256", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["domains"], summary["tiers"], summary["planes"], summary["rails"]) == (8, 3, 2, 4)
    assert summary["network_bisection_Bps"] == pytest.approx(256 * 100e9 / 2 / 2.0)
    result = run_cli("collective", "all_reduce", "--system", path, "--gpus", "256", "--size", "1G", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["results"][0]["time_s"] > 0


BAD = {
    "negative_rate": (_variant(**{"scale_out.nic_bandwidth_Bps": -5}), "scale_out.nic_bandwidth_Bps"),
    "typo_field": (_variant(**{"scale_out.plains": 2}), "scale_out.plains"),
    "missing_nvlink": (_variant(nvlink=None), "nvlink"),
    "misspelt_required_field": (  # name the typo, not only "link_bandwidth_Bps: Field required"
        _variant(**{"nvlink.link_bandwidth_Bps": None, "nvlink.link_bandwidth_bps": 50e9}),
        "nvlink.link_bandwidth_bps: unknown key; did you mean 'link_bandwidth_Bps'?"),
    "rails_do_not_divide": (_variant(**{"scale_out.rails": 5}), "scale_out.rails 5 must divide"),
    "tiers_out_of_range": (_variant(**{"scale_out.tiers": 4}), "scale_out.tiers"),
    "not_a_mapping": ("- just\n- a list\n", "mapping"),
    "malformed": ("name: x\ngpu: [1,\n", "malformed YAML"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_system_files_fail_with_one_clear_line(tmp_path, run_cli, case):
    data, needle = BAD[case]
    path = _write(tmp_path, case, data)
    with pytest.raises(UserInputError) as err:
        load_system(path)
    assert needle in str(err.value) and "\n" not in str(err.value)
    result = run_cli("topology", "--system", path, "--gpus", "144")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and needle in result.stderr and "Traceback" not in result.output


def test_a_directory_given_as_system_file_is_named_as_such(tmp_path, run_cli):
    result = run_cli("topology", "--system", str(tmp_path), "--gpus", "72")
    assert result.exit_code == 2 and "is a directory" in result.stderr and result.stderr.count("\n") == 1


def test_a_fabric_too_small_for_the_job_is_one_line(tmp_path, run_cli):
    path = _write(tmp_path, "small", _variant(**{"scale_out.switch_radix": 16, "scale_out.tiers": 2}))
    result = run_cli("collective", "all_reduce", "--system", path, "--gpus", "288", "--size", "1G")
    assert result.exit_code == 2
    assert "two-tier fabric of radix 16 holds 128 NICs" in result.stderr and result.stderr.count("\n") == 1


def test_missing_system_file_is_one_line(run_cli):
    result = run_cli("topology", "--system", "/nonexistent/sys.yaml")
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_every_shipped_yaml_file_loads_as_safe_load_gives_it() -> None:
    """The fast (libyaml) safe loader builds the very objects ``yaml.safe_load`` builds, for every YAML
    file of the repository (systems, models, defaults tables, calibration profiles, scenarios)."""
    from topologies.inputs import load_yaml_file

    root = Path(__file__).resolve().parents[1]
    files = [p for p in root.rglob("*.y*ml") if ".git" not in p.parts and p.suffix in (".yaml", ".yml")]
    assert len(files) >= 10
    for path in files:
        expected = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(expected, dict):
            assert load_yaml_file(path) == expected, path


def test_malformed_yaml_message_names_line_and_column(tmp_path: Path) -> None:
    from topologies.inputs import load_yaml_file

    path = tmp_path / "bad.yaml"
    path.write_text("a: 1\nb: [2,\n", encoding="utf-8")
    with pytest.raises(UserInputError, match=r"malformed YAML at line 3, column 1"):
        load_yaml_file(path)
