#!/usr/bin/env bash
# The C++ sources of liblmr and its tools whose includes reach a header with clang
# thread-safety annotations: the only code the analysis can say anything about (a file that
# reaches none has no annotated lock, member or function to check). For make lint-threads.
set -euo pipefail
annotated=$(grep -rlE 'LMR_(GUARDED_BY|PT_GUARDED_BY|REQUIRES|ACQUIRE|RELEASE|EXCLUDES|CAPABILITY|SCOPED_CAPABILITY)' include src tools | grep -E '\.h$')
names=$(for h in $annotated; do basename "$h"; done | sort -u)
while :; do
  pattern=$(printf '%s\n' $names | sed 's/\./\\./g' | paste -sd'|')
  more=$(grep -rlE "#include [\"<]([a-z_/-]*/)?($pattern)[\">]" include src tools | grep -E '\.h$' | xargs -r -n1 basename | sort -u)
  all=$(printf '%s\n' $names $more | sort -u)
  [ "$all" = "$names" ] && break
  names=$all
done
pattern=$(printf '%s\n' $names | sed 's/\./\\./g' | paste -sd'|')
git ls-files -- src tools | grep -E '\.cc$' |
  xargs grep -lE "#include [\"<]([a-z_/-]*/)?($pattern)[\">]|LMR_(GUARDED_BY|REQUIRES|ACQUIRE|RELEASE|EXCLUDES)"
