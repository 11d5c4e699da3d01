"""headroom.mig: the catalogue, names, what nodes offer, and the choice."""

import pytest

from headroom.mig import (
    CATALOGUE,
    KNOWN_PROFILES,
    MigOffer,
    catalogue_for_product,
    choose_profile,
    memory_mib,
    parse_profile_name,
    profile_from_resource,
)
from headroom.names import mig_resource
from headroom.quantity import GIB, MIB


def test_catalogue_is_design_section_7() -> None:
    a100 = {p.name: (p.memory_mib, p.max_instances) for p in CATALOGUE["A100-40GB"]}
    assert a100 == {
        "1g.5gb": (4864, 7),
        "1g.10gb": (9856, 4),
        "2g.10gb": (9856, 3),
        "3g.20gb": (19968, 2),
        "4g.20gb": (19968, 1),
        "7g.40gb": (40192, 1),
    }
    assert [p.name for p in CATALOGUE["H100-80GB"]] == [p.name for p in CATALOGUE["A100-80GB"]]
    assert {p.name: p.memory_mib for p in CATALOGUE["A30-24GB"]} == {
        "1g.6gb": 5836,
        "2g.12gb": 11672,
        "4g.24gb": 23344,
    }


def test_one_name_has_one_memory_size_across_models() -> None:
    sizes: dict[str, set[int]] = {}
    for profiles in CATALOGUE.values():
        for profile in profiles:
            sizes.setdefault(profile.name, set()).add(profile.memory_mib)
    assert all(len(s) == 1 for s in sizes.values())
    assert KNOWN_PROFILES["1g.10gb"].max_instances == 7  # the most any model allows


@pytest.mark.parametrize(
    ("name", "parsed"),
    [("3g.20gb", (3, 20, "")), ("1g.10gb+me", (1, 10, "+me")), ("7g.80gb", (7, 80, ""))],
)
def test_parse_profile_name(name: str, parsed: tuple[int, int, str]) -> None:
    assert parse_profile_name(name) == parsed


@pytest.mark.parametrize("name", ["3g", "20gb", "0g.5gb", "g.5gb", "3g.20GB", ""])
def test_parse_profile_name_rejects(name: str) -> None:
    with pytest.raises(ValueError, match="MIG profile"):
        parse_profile_name(name)


@pytest.mark.parametrize("name", ["3g.20gb", "1g.10gb+me", "1g.24gb-me", "1g.10gb+me.all"])
def test_resource_names_round_trip(name: str) -> None:
    assert profile_from_resource(mig_resource(name)) == name


def test_other_resources_are_not_profiles() -> None:
    assert profile_from_resource("nvidia.com/gpu") is None
    assert profile_from_resource("nvidia.com/mig-weird") is None


@pytest.mark.parametrize(
    ("product", "first"),
    [
        ("NVIDIA-A100-PCIE-40GB", "1g.5gb"),
        ("A100-PCIE-40GB-MIG-1g.5gb", "1g.5gb"),
        ("NVIDIA-A100-SXM4-80GB", "1g.10gb"),
        ("NVIDIA-H100-80GB-HBM3", "1g.10gb"),
        ("NVIDIA-A30", "1g.6gb"),
    ],
)
def test_catalogue_for_gfd_products(product: str, first: str) -> None:
    assert catalogue_for_product(product)[0].name == first


def test_unknown_products_have_no_catalogue() -> None:
    assert catalogue_for_product("Tesla-T4") == ()
    assert catalogue_for_product("NVIDIA-H100-NVL") == ()


NODES = [
    {
        "metadata": {
            "name": "a100-mixed",
            "labels": {
                "nvidia.com/mig.strategy": "mixed",
                "nvidia.com/mig-3g.20gb.count": "1",
                "nvidia.com/mig-3g.20gb.memory": "19968",
                "nvidia.com/mig-2g.10gb.memory": "9800",
                "nvidia.com/mig-1g.10gb.me.memory": "9856",
            },
        },
        "status": {
            "capacity": {
                "cpu": "16",
                "nvidia.com/gpu": "0",
                "nvidia.com/mig-3g.20gb": "1",
                "nvidia.com/mig-2g.10gb": "2",
                "nvidia.com/mig-1g.10gb.me": "1",
                "nvidia.com/mig-1g.5gb": "0",
            }
        },
    },
    {"metadata": {"name": "second"}, "status": {"capacity": {"nvidia.com/mig-3g.20gb": "2"}}},
]


def test_offer_from_nodes_sums_capacity_and_reads_memory_labels() -> None:
    offer = MigOffer.from_nodes(NODES)
    assert {name: (p.memory_mib, p.instances) for name, p in offer.profiles.items()} == {
        "1g.10gb+me": (9856, 1),
        "2g.10gb": (9800, 2),
        "3g.20gb": (19968, 3),
    }
    assert not offer.offers("1g.5gb")  # capacity 0 is no offer


def test_offer_ignores_malformed_nodes() -> None:
    garbage = [
        None,
        3,
        {"status": "x"},
        {"metadata": {"labels": ["a"]}, "status": {"capacity": {"nvidia.com/mig-3g.20gb": True}}},
        {"status": {"capacity": {"nvidia.com/mig-3g.20gb": "²"}}},  # a digit int() refuses
        {"status": {"capacity": {"nvidia.com/mig-3g.20gb": "٣"}}},
    ]
    assert MigOffer.from_nodes(garbage).profiles == {}  # type: ignore[arg-type]


def test_memory_prefers_advertised_then_table_then_a_low_estimate() -> None:
    offer = MigOffer.from_nodes(NODES)
    assert memory_mib("2g.10gb", offer) == 9800
    assert memory_mib("2g.10gb") == 9856
    assert memory_mib("1g.10gb+me") == 9856
    assert memory_mib("1g.12gb") == 12 * 900


def test_choice_ranks_by_memory_then_slices() -> None:
    choice = choose_profile(
        9 * GIB, allowed=["2g.10gb", "1g.10gb", "3g.20gb"], fallback="larger", offer=None
    )
    assert (choice.profile, choice.memory_mib, choice.reason) == ("1g.10gb", 9856, "")


def test_choice_exact_fit_counts() -> None:
    choice = choose_profile(
        4864 * MIB, allowed=["1g.5gb", "2g.10gb"], fallback="larger", offer=None
    )
    assert choice.profile == "1g.5gb"


def test_choice_without_allow_list_uses_the_offer() -> None:
    offer = MigOffer.from_nodes(NODES)
    choice = choose_profile(1 * GIB, allowed=[], fallback="deny", offer=offer)
    assert choice.profile == "2g.10gb"


def test_choice_falls_back_to_not_offered_when_nothing_fitting_is_offered() -> None:
    offer = MigOffer.from_nodes(NODES)
    choice = choose_profile(30 * GIB, allowed=["7g.40gb"], fallback="larger", offer=offer)
    assert choice.profile == "7g.40gb"
    assert "no node offers nvidia.com/mig-7g.40gb yet" in choice.reason


def test_choice_refuses_with_declared_and_largest() -> None:
    choice = choose_profile(41 * GIB, allowed=["1g.5gb", "7g.40gb"], fallback="larger", offer=None)
    assert choice.profile is None
    assert choice.reason == "no allowed MIG profile has 41Gi (largest: 7g.40gb, 40192Mi)"


def test_offer_takes_the_smallest_memory_the_nodes_give_one_profile() -> None:
    # A review's case: one name, two sizes (DESIGN.md §7: an H100-80GB's 1g.10gb is
    # 9,984 MiB on recent drivers, an A100's 9,856). The offer kept the last node's
    # label, so a pod declaring 9,900 MiB was given 1g.10gb and could be placed on
    # the A100's slice, which cannot hold its declaration.
    def node(name: str, mib: str) -> dict[str, object]:
        return {
            "metadata": {"name": name, "labels": {"nvidia.com/mig-1g.10gb.memory": mib}},
            "status": {"capacity": {"nvidia.com/mig-1g.10gb": "4", "nvidia.com/mig-3g.40gb": "1"}},
        }

    for nodes in (
        [node("a100", "9856"), node("h100", "9984")],
        [node("h100", "9984"), node("a100", "9856")],
    ):
        offer = MigOffer.from_nodes(nodes)
        assert offer.profiles["1g.10gb"].memory_mib == 9856
        choice = choose_profile(
            9900 * MIB, allowed=["1g.10gb", "3g.40gb"], fallback="deny", offer=offer
        )
        assert choice.profile == "3g.40gb", choice
    # A node without the label counts with the table's size for it.
    unlabelled = {
        "metadata": {"name": "old"},
        "status": {"capacity": {"nvidia.com/mig-1g.10gb": "4"}},
    }
    offer = MigOffer.from_nodes([unlabelled, node("h100", "9984")])
    assert offer.profiles["1g.10gb"].memory_mib == 9856
