;; A hostile handler that holds as much of the instance pool as one invocation may: eight
;; linear memories, then a loop until its deadline. A route serving it must not starve its
;; neighbours of instances (tests/tests/it/fairness.rs).
(module
  (memory (export "memory") 1)
  (memory 1) (memory 1) (memory 1) (memory 1) (memory 1) (memory 1) (memory 1)
  (global $next (mut i32) (i32.const 1024))

  ;; A bump allocator for the arguments the host passes in.
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
    (local $at i32)
    (local.set $at
      (i32.and
        (i32.add (global.get $next) (i32.sub (local.get 2) (i32.const 1)))
        (i32.sub (i32.const 0) (local.get 2))))
    (global.set $next (i32.add (local.get $at) (local.get 3)))
    (if (i32.gt_u (global.get $next) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow (i32.const 16)))))
    (local.get $at))

  ;; handle(event) -> result<list<output>, failure>: spin until the epoch deadline stops it.
  (func (export "dedup:handler/handler@0.1.0#handle")
    (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)
    (loop $spin (br $spin))
    ;; Unreachable; the result area at 16 is all zeros: ok, no outputs.
    (i32.const 16)))
