# write_ids_npy FILE: input ids [2, 5] as an int64 .npy (numpy 1.0 header, padded to 64 bytes), ids
# below 64, for the `logits` comparisons of the CLI tests.
write_ids_npy() {
  python3 - "$1" <<'PY'
import struct, sys
h = "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 5), }"
h += " " * (64 - 10 - len(h) - 1) + "\n"
ids = [1, 5, 9, 2, 33, 60, 0, 7, 7, 41]
open(sys.argv[1], "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + struct.pack("<10q", *ids))
PY
}
