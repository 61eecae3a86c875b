#!/bin/bash
# GPU measurement of the bi-encoder roles (issue 34 item 6), on a lent device machine that has torch/transformers but no
# pip access and a 64 MiB transfer per call. Usage: CFG=<carried folder> bash benchmarks/gpu/run.sh <chunk dir> <out dir> [runs...]
#   <chunk dir>: part0* = all-mpnet-base-v2 safetensors in fp16 (split over calls), mini0* = MiniLM-L6 likewise;
#   $CFG: whl/ (pydantic and its three deps, cp312), data.tar (the clean/normalized parquet files the stages read),
#   mpnet/ and minilm/ (the models' json/txt files). The stages run unchanged (device=cuda, params set by setp.py); dvclive
#   is stood in for by shim/ (its dvc dependency is not there). Each run leaves <out dir>/<run>.tgz (metrics, scores, log).
#   Stage task2 needs data/raw (not carried): run it here over each run's task2_probs.parquet.
# Results: metrics/gpu_bi_encoders.json (rendered in RESULTS by `medrank report`)
ST=$1; O=$2; shift 2
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ -z "$NOINSTALL" ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $CFG/whl/*.whl || exit 1; export PYTHONPATH=/tmp/site; fi
export PYTHONPATH=$PYTHONPATH:$PWD/benchmarks/gpu/shim:$PWD
tar xf $CFG/data.tar
python3 benchmarks/gpu/assemble.py $ST/part0 /root/mpnet $CFG/mpnet || exit 1
[ -e $ST/mini000 ] && python3 benchmarks/gpu/assemble.py $ST/mini0 /root/minilm $CFG/minilm
mkdir -p /tmp/logs
nvidia-smi -L; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.is_available())"
cp params.yaml /tmp/params.orig.yaml
M=/root/mpnet; L=/root/minilm
one() {  # name stage outputs -- params
  name=$1; stage=$2; outs=$3; shift 3
  cp /tmp/params.orig.yaml params.yaml; python3 benchmarks/gpu/setp.py device=${DEVICE:-cuda} "$@" || return
  S0=$SECONDS; python3 -m stages.$stage > /tmp/logs/$name.log 2>&1; rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - S0))" | tee -a $O/summary.txt
  tail -2 /tmp/logs/$name.log
  tar czf $O/$name.tgz $outs /tmp/logs/$name.* params.yaml 2>/dev/null
}
for r in "$@"; do case $r in
  rqe_mpnet) one rqe_mpnet finetune_rqe "metrics/finetune_rqe.json data/processed/task2_probs.parquet" finetune.rqe.base_model=$M finetune.rqe.bi_encoder=$M $RQE_EXTRA ;;
  rqe_minilm) one rqe_minilm finetune_rqe "metrics/finetune_rqe.json data/processed/task2_probs.parquet" finetune.rqe.base_model=$L finetune.rqe.bi_encoder=$L $RQE_EXTRA ;;
  qa_mpnet) one qa_mpnet qa_bienc "metrics/qa_bienc.json data/processed/qa_bienc_scores.parquet" qa_bienc.base_model=$M $QA_EXTRA ;;
  qa_mpnet_all) one qa_mpnet_all qa_bienc "metrics/qa_bienc.json data/processed/qa_bienc_scores.parquet" qa_bienc.base_model=$M qa_bienc.medquad_triplets=${ALL_TRIPLETS:-16000} $QA_EXTRA ;;
  qa_minilm) one qa_minilm qa_bienc "metrics/qa_bienc.json data/processed/qa_bienc_scores.parquet" qa_bienc.base_model=$L $QA_EXTRA ;;
esac; done
