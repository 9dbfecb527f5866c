# vramlab report: gnuplot batch.gp in this folder re-renders batch.png
if (!exists("vl_png")) vl_png = 'batch.png'
set terminal png size 900,480 noenhanced
set output vl_png
set title 'Memory vs micro-batch at sequence 512 (rung after, planned, full scale)'
set xlabel 'micro-batch'
set ylabel 'GB'
set grid
set key below
set arrow from 75, graph 0 to 75, graph 1 nohead lc rgb 'black' dt 2
set label 'max batch 75' at 75, graph 0.05 right offset -0.5,0
plot 'batch.dat' using 1:2 with linespoints lw 2 title 'reserved extent (live bytes and holes: what the cap bounds), uncapped', 'batch_live.dat' using 1:2 with lines lw 1 dt 3 lc rgb '#777777' title 'live bytes at the peak', 23.7082 with lines lw 2 lc rgb 'red' title 'cap'
