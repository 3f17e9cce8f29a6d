;; A hostile handler that holds as much of the instance pool as one invocation may: eight
;; linear memories (one per core instance), then a loop until its deadline stops it. A route
;; serving it must not starve its neighbours of instances (tests/tests/it/fairness.rs).
;; Written as a whole component (from `wasm-tools print` of a one-memory handler) because
;; `wasm-tools component new` makes one core instance.
(component
  (type $ty-dedup:handler/types@0.1.0 (;0;)
    (instance
      (type (;0;) (record (field "name" string) (field "value" string)))
      (export (;1;) "header" (type (eq 0)))
      (type (;2;) (list u8))
      (type (;3;) (list 1))
      (type (;4;) (record (field "subject" string) (field "payload" 2) (field "headers" 3) (field "key" string) (field "attempt" u32) (field "fencing-token" u64) (field "stream-sequence" u64) (field "route" string)))
      (export (;5;) "event" (type (eq 4)))
      (type (;6;) (record (field "subject" string) (field "payload" 2) (field "headers" 3)))
      (export (;7;) "output" (type (eq 6)))
      (type (;8;) (option u64))
      (type (;9;) (record (field "reason" string) (field "delay-ms" 8)))
      (export (;10;) "retry-request" (type (eq 9)))
      (type (;11;) (variant (case "retry" 10) (case "reject" string)))
      (export (;12;) "failure" (type (eq 11)))
    )
  )
  (import "dedup:handler/types@0.1.0" (instance $dedup:handler/types@0.1.0 (;0;) (type $ty-dedup:handler/types@0.1.0)))
  (core module $main (;0;)
    (type (;0;) (func (param i32 i32 i32 i32) (result i32)))
    (type (;1;) (func (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
    (memory (;0;) 1)
    (global $next (;0;) (mut i32) i32.const 1024)
    (export "memory" (memory 0))
    (export "cabi_realloc" (func 0))
    (export "dedup:handler/handler@0.1.0#handle" (func 1))
    (func (;0;) (type 0) (param i32 i32 i32 i32) (result i32)
      (local $at i32)
      global.get $next
      local.get 2
      i32.const 1
      i32.sub
      i32.add
      i32.const 0
      local.get 2
      i32.sub
      i32.and
      local.set $at
      local.get $at
      local.get 3
      i32.add
      global.set $next
      global.get $next
      memory.size
      i32.const 65536
      i32.mul
      i32.gt_u
      if ;; label = @1
        i32.const 16
        memory.grow
        drop
      end
      local.get $at
    )
    (func (;1;) (type 1) (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)
      loop $spin
        br $spin
      end
      i32.const 16
    )
  )
  (alias export $dedup:handler/types@0.1.0 "event" (type $event (;1;)))
  (alias export $dedup:handler/types@0.1.0 "output" (type $output (;2;)))
  (alias export $dedup:handler/types@0.1.0 "failure" (type $failure (;3;)))
  (core instance $main (;0;) (instantiate $main))
  ;; Seven more core instances, each with a memory of its own: eight memories per invocation.
  (core module $hoard (memory (export "m") 1))
  (core instance (instantiate $hoard))
  (core instance (instantiate $hoard))
  (core instance (instantiate $hoard))
  (core instance (instantiate $hoard))
  (core instance (instantiate $hoard))
  (core instance (instantiate $hoard))
  (core instance (instantiate $hoard))
  (alias core export $main "memory" (core memory $memory (;0;)))
  (type (;4;) (list $output))
  (type (;5;) (result 4 (error $failure)))
  (type (;6;) (func (param "event" $event) (result 5)))
  (alias core export $main "dedup:handler/handler@0.1.0#handle" (core func $dedup:handler/handler@0.1.0#handle (;0;)))
  (alias core export $main "cabi_realloc" (core func $cabi_realloc (;1;)))
  (func $handle (;0;) (type 6) (canon lift (core func $dedup:handler/handler@0.1.0#handle) (memory $memory) (realloc $cabi_realloc) string-encoding=utf8))
  (alias export $dedup:handler/types@0.1.0 "header" (type $header (;7;)))
  (alias export $dedup:handler/types@0.1.0 "retry-request" (type $retry-request (;8;)))
  (component $dedup:handler/handler@0.1.0-shim-component (;0;)
    (type (;0;) (record (field "name" string) (field "value" string)))
    (import "import-type-header" (type (;1;) (eq 0)))
    (type (;2;) (list u8))
    (type (;3;) (list 1))
    (type (;4;) (record (field "subject" string) (field "payload" 2) (field "headers" 3) (field "key" string) (field "attempt" u32) (field "fencing-token" u64) (field "stream-sequence" u64) (field "route" string)))
    (import "import-type-event" (type (;5;) (eq 4)))
    (type (;6;) (record (field "subject" string) (field "payload" 2) (field "headers" 3)))
    (import "import-type-output" (type (;7;) (eq 6)))
    (type (;8;) (option u64))
    (type (;9;) (record (field "reason" string) (field "delay-ms" 8)))
    (import "import-type-retry-request" (type (;10;) (eq 9)))
    (type (;11;) (variant (case "retry" 10) (case "reject" string)))
    (import "import-type-failure" (type (;12;) (eq 11)))
    (import "import-type-event0" (type (;13;) (eq 5)))
    (import "import-type-output0" (type (;14;) (eq 7)))
    (type (;15;) (list 14))
    (import "import-type-failure0" (type (;16;) (eq 12)))
    (type (;17;) (result 15 (error 16)))
    (type (;18;) (func (param "event" 13) (result 17)))
    (import "import-func-handle" (func (;0;) (type 18)))
    (export (;19;) "event" (type 5))
    (export (;20;) "output" (type 7))
    (export (;21;) "failure" (type 12))
    (type (;22;) (list 20))
    (type (;23;) (result 22 (error 21)))
    (type (;24;) (func (param "event" 19) (result 23)))
    (export (;1;) "handle" (func 0) (func (type 24)))
  )
  (instance $dedup:handler/handler@0.1.0-shim-instance (;1;) (instantiate $dedup:handler/handler@0.1.0-shim-component
      (with "import-func-handle" (func $handle))
      (with "import-type-header" (type $header))
      (with "import-type-event" (type $event))
      (with "import-type-output" (type $output))
      (with "import-type-retry-request" (type $retry-request))
      (with "import-type-failure" (type $failure))
      (with "import-type-event0" (type $event))
      (with "import-type-output0" (type $output))
      (with "import-type-failure0" (type $failure))
    )
  )
  (export $dedup:handler/handler@0.1.0 (;2;) "dedup:handler/handler@0.1.0" (instance $dedup:handler/handler@0.1.0-shim-instance))
  (@producers
    (processed-by "wit-component" "0.262.0")
  )
)
