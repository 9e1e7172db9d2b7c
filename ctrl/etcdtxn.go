package ctrl

import (
	"encoding/json"
	"maps"
	"net/url"
	"slices"
)

// EtcdOp is one operation of the transaction an EtcdStore's Save issues: a put of Value at Key,
// or a delete of Key.
type EtcdOp struct {
	Key, Value string
	Delete     bool
}

// EtcdSaveTxn is the transaction EtcdStore.Save issues to move a store holding known (its keys
// and values, as last read or written) to st: a put of meta always (its ModRevision is the
// state's revision), a put of every other key whose value changed, in key order, then a delete
// of every key that went. kv is what the store holds after it. Save and the ctrl simulation
// (workloads/ctrlsim), which counts the transactions a ctrl would issue, both call it, so what
// is counted is what is written.
func EtcdSaveTxn(prefix string, known map[string]string, st State) (kv map[string]string, ops []EtcdOp, err error) {
	kv, err = encodeEtcd(prefix, st)
	if err != nil {
		return nil, nil, err
	}
	meta := prefix + etcdMeta
	ops = []EtcdOp{{Key: meta, Value: kv[meta]}}
	for _, k := range slices.Sorted(maps.Keys(kv)) {
		if v, ok := known[k]; k != meta && (!ok || v != kv[k]) {
			ops = append(ops, EtcdOp{Key: k, Value: kv[k]})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(known)) {
		if _, ok := kv[k]; !ok {
			ops = append(ops, EtcdOp{Key: k, Delete: true})
		}
	}
	return kv, ops, nil
}

// encodeEtcd is st as the store's keys and values under prefix (which ends in "/").
func encodeEtcd(prefix string, st State) (map[string]string, error) {
	out := map[string]string{}
	put := func(k string, v any) error {
		b, err := json.Marshal(v)
		out[prefix+k] = string(b)
		return err
	}
	if err := put(etcdMeta, etcdMetaValue{Version: st.Version, NextSlab: st.NextSlab}); err != nil {
		return nil, err
	}
	for _, s := range st.Servers {
		if err := put(etcdServers+url.PathEscape(s.ID), s); err != nil {
			return nil, err
		}
	}
	for _, s := range st.Sessions {
		if err := put(etcdSessions+s.ID.String(), s); err != nil {
			return nil, err
		}
	}
	return out, nil
}
